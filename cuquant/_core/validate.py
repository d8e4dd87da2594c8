"""Refusals of bad input. Every check raises TypeError (wrong kind or dtype) or ValueError
(wrong shape, size or value) with a message that names the function, the argument, what
was expected and what was given. Kernels never validate: nothing unchecked is launched."""

from __future__ import annotations

import math
import operator

import numpy as np

from .dtypes import FLOATS, FloatType, float_type_of


def dtype_name(a) -> str:
    """The dtype as the caller knows it (torch.float8_e4m3fn rather than the uint8 view)."""
    src = a.source
    if a.family == "torch":
        return str(src.dtype).removeprefix("torch.")
    if a.family == "jax":
        return str(src.dtype)
    return a.data.dtype.name


def check_float(a, op: str, arg: str, allowed=FLOATS) -> FloatType:
    t = float_type_of(a.data.dtype)
    if t is None or t.name not in allowed:
        raise TypeError(f"{op}: {arg} must be {' or '.join(allowed)}; got {dtype_name(a)}")
    return t


def check_dtype(a, op: str, arg: str, allowed: dict) -> str:
    """`allowed` maps backend dtypes to a name; returns the name."""
    name = allowed.get(a.data.dtype)
    if name is None:
        want = " or ".join(sorted(set(allowed.values())))
        raise TypeError(f"{op}: {arg} must be {want}; got {dtype_name(a)}")
    return name


def check_ndim(a, op: str, arg: str, ndim: int, layout: str) -> None:
    if a.data.ndim != ndim:
        raise ValueError(
            f"{op}: {arg} must be a {ndim}-D array {layout}; got shape {tuple(a.data.shape)}"
        )


def check_min_ndim(a, op: str, arg: str, ndim: int, layout: str) -> None:
    if a.data.ndim < ndim:
        raise ValueError(
            f"{op}: {arg} must have at least {ndim} dimension(s) {layout}; "
            f"got shape {tuple(a.data.shape)}"
        )


def check_shape(a, op: str, arg: str, shape: tuple, layout: str) -> None:
    if tuple(a.data.shape) != tuple(shape):
        raise ValueError(
            f"{op}: {arg} must have shape {tuple(shape)} {layout}; got {tuple(a.data.shape)}"
        )


def check_int(value, op: str, arg: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{op}: {arg} must be an integer; got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {arg} must be an integer; got {value!r}") from None
    if minimum is not None and v < minimum:
        raise ValueError(f"{op}: {arg} must be >= {minimum}; got {v}")
    return v


def seed_in_range(seed: int) -> bool:
    """Whether an int is a seed: Philox4x32-10's 64-bit key."""
    return 0 <= seed < 1 << 64


def check_seed(seed, op: str) -> int:
    s = check_int(seed, op, "seed")
    if not seed_in_range(s):
        raise ValueError(f"{op}: seed must be in [0, 2**64); got {s}")
    return s


# Seeds reach a repeated call's replay as run-time values (`_core.replay.replayable`).
SEED_VALUE = {"seed": seed_in_range}


def check_choice(value, op: str, arg: str, choices) -> object:
    if value not in choices:
        raise ValueError(f"{op}: {arg} must be one of {list(choices)}; got {value!r}")
    return value


_POSITIVE: dict = {}


def check_positive_finite(value, op: str, arg: str) -> np.float32:
    """A float argument that must round to a finite float32 above zero."""
    if type(value) is float:  # the common case, remembered: NumPy scalars cost ~1 us a call
        f32 = _POSITIVE.get(value)
        if f32 is None:
            f32 = _check_positive_finite(value, op, arg)
            if len(_POSITIVE) < 64:
                _POSITIVE[value] = f32
        return f32
    return _check_positive_finite(value, op, arg)


def _check_positive_finite(value, op: str, arg: str) -> np.float32:
    if isinstance(value, bool):
        raise TypeError(f"{op}: {arg} must be a number; got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {arg} must be a number; got {value!r}") from None
    f32 = np.float32(f)
    if not (math.isfinite(f) and np.isfinite(f32) and f32 > 0):
        raise ValueError(f"{op}: {arg} must be a finite number > 0 (as float32); got {value!r}")
    return f32


# ---------------------------------------------------------------------------------------
# Group-wise formats (DeepSpeed's and the zero point's)

BITS = (4, 8)  # the code widths of the group-wise formats


def check_bits(bits, op: str, arg: str = "bits") -> int:
    b = check_int(bits, op, arg)
    check_choice(b, op, arg, BITS)
    return b


def check_bool(value, op: str, arg: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {arg} must be a bool (True or False); got {value!r}")
    return bool(value)


def check_group_size(group_size, op: str, n: int, what: str = "the size of x",
                     arg: str = "group_size") -> int:
    g = check_int(group_size, op, arg, minimum=1)
    if n % g:
        raise ValueError(f"{op}: {arg} must divide {what} ({n}); got {g}")
    return g


def check_even_last(a, op: str, arg: str, bits: int) -> None:
    shape = tuple(a.data.shape)
    if bits == 4 and (len(shape) == 0 or shape[-1] % 2):
        raise ValueError(f"{op}: {arg} must have an even last axis for bits=4 (two codes a "
                         f"byte); got shape {shape}")


def check_exact_dtype(a, op: str, arg: str, dtype) -> None:
    """a holds exactly `dtype` (codes of a given storage)."""
    if a.data.dtype != dtype:
        raise TypeError(f"{op}: {arg} must be {np.dtype(dtype).name}; got {dtype_name(a)}")
