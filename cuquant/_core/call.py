"""The path every public op follows: take the arguments in, check them, run the NumPy twin
for host arrays or the kernels on the arrays' device, hand the results back in the
caller's family. An op module only says what is particular to it."""

from __future__ import annotations

import numpy as np

from . import validate as v
from .arrays import HOST, In, contiguous, intake, outcome, same_place, stream_arg
from .dtypes import E4M3, FLOATS, INT8, float_type_named

__all__ = ["HOST", "In", "intake", "same_place", "host_results", "stream_of",
           "contiguous", "scale_argument", "one_float32", "code_input", "out_dtype",
           "dequant_args", "check_one_value", "scale_type_of", "v", "FLOATS"]

_CODE_DTYPES = {
    INT8.name: {np.dtype(np.int8): INT8.name},
    E4M3.name: {np.dtype(np.uint8): E4M3.name, E4M3.numpy: E4M3.name},
}


def stream_of(stream, op: str):
    if stream is None:
        return None
    return stream_arg(stream, op)


def host_results(like: In, results):
    """Hand NumPy results back (a tuple, or one array)."""
    if like.family == "numpy":
        return results
    if isinstance(results, tuple):
        return tuple(outcome(like, r) for r in results)
    return outcome(like, results)



def code_input(a: In, op: str, arg: str, code) -> None:
    """q must hold codes of `code` (fp8 may arrive as float8_e4m3fn or as uint8 codes)."""
    v.check_dtype(a, op, arg, _CODE_DTYPES[code.name])


def out_dtype(dtype, op: str):
    return float_type_named(dtype, op, "dtype")


def scale_type_of(scale_dtype, t, op: str):
    """The stored type of a quantizer's scales: float32, or the input's own type t (the
    scale rounded to it, as checkpoints in a model's dtype store it)."""
    st = float_type_named(scale_dtype, op, "scale_dtype")
    if st is not FLOATS["float32"] and st is not t:
        raise ValueError(f"{op}: scale_dtype must be float32 or the input's dtype ({t.name}); "
                         f"got {st.name}")
    return st


def dequant_args(op: str, q, scale, dtype, stream, code):
    """The arguments every dequantizer takes: codes, a float32 scale, the output dtype."""
    s = stream_of(stream, op)
    out = out_dtype(dtype, op)
    a = intake(q, op, "q", s)
    code_input(a, op, "q", code)
    b = intake(scale, op, "scale", s)
    v.check_float(b, op, "scale", {"float32": FLOATS["float32"]})
    same_place(op, ("q", a), ("scale", b))
    return s, out, a, b


def check_one_value(b: In, op: str, arg: str = "scale") -> None:
    if b.data.size != 1:
        raise ValueError(f"{op}: {arg} must hold one value (shape () or (1,)); got shape "
                         f"{tuple(b.data.shape)}")


def one_float32(value, op: str, arg: str, first: tuple[str, In], stream,
                positive: bool = True):
    """A float32 argument of one value: a number, or a float32 array of one element on the
    device of `first` (its name and array) or on the host. Returns (np.float32 or None,
    device array or None). A value on the host is checked to round to a finite float32
    above 0 when `positive`; a device array is taken as it is (reading it would sync)."""
    if isinstance(value, bool):
        raise TypeError(f"{op}: {arg} must be a number or a float32 array of one element; got "
                        f"{value!r}")
    if isinstance(value, (int, float, np.floating, np.integer)):
        return _host_float32(value, op, arg, positive), None
    a = intake(value, op, arg, stream)
    if a.data.dtype != np.float32:
        raise TypeError(f"{op}: {arg} must be float32; got {v.dtype_name(a)}")
    check_one_value(a, op, arg)
    if a.device == HOST:
        return _host_float32(a.data.reshape(()).item(), op, arg, positive), None
    same_place(op, first, (arg, a))
    return None, a.data


def _host_float32(value, op: str, arg: str, positive: bool) -> np.float32:
    return v.check_positive_finite(value, op, arg) if positive else np.float32(value)


def scale_argument(scale, op: str, x: In, stream):
    """A per-tensor scale (`one_float32`, positive): (float or None, device array or None)."""
    value, device_scale = one_float32(scale, op, "scale", ("x", x), stream)
    return (None if value is None else float(value)), device_scale
