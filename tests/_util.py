"""Bit-exact comparison of results from any array family."""

from __future__ import annotations

import sys

import numpy as np


def to_numpy(a) -> np.ndarray:
    """Any result (NumPy, CuPy, torch, JAX) as a NumPy array with the same bits."""
    mod = type(a).__module__ or ""
    if isinstance(a, np.ndarray):
        return a
    if mod.startswith("cupy"):
        return a.get()
    if mod.startswith("torch"):
        torch = sys.modules["torch"]
        t = a.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        if t.dtype.itemsize == 1 and t.dtype not in (torch.uint8, torch.int8, torch.bool):
            return t.view(torch.uint8).numpy()   # float8 codes, E8M0 scales, packed float4
        return t.numpy()
    return np.asarray(a)


def bits(a) -> np.ndarray:
    """The raw bits of an array as unsigned integers of the same width."""
    n = np.ascontiguousarray(to_numpy(a))
    return n.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[n.itemsize])


def assert_same_bits(got, want, what: str = "") -> None:
    """Equal shapes and equal bits, element for element; reports the first mismatches."""
    g, w = bits(got), bits(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    if not np.array_equal(g, w):
        bad = np.argwhere(g != w)
        first = [tuple(int(i) for i in b) for b in bad[:8]]
        detail = ", ".join(f"{i}: got {g[i]:#x} want {w[i]:#x}" for i in first)
        raise AssertionError(f"{what}: {len(bad)} of {g.size} elements differ; {detail}")


def assert_refused(fn, args, kwargs, exc, words) -> None:
    """fn(*args, **kwargs) raises `exc` with a message that starts with the function's name
    and contains every one of `words` (the argument, the expectation, the value given)."""
    import pytest

    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert msg.startswith(fn.__name__ + ":"), msg
    for w in words:
        assert w in msg, (w, msg)


def op_variant_cases(ops, skip: tuple[str, ...] = ()) -> list:
    """A pytest parameter (op, variant) for every variant of every declaration in `ops`
    (those named in `skip` left out), identified as ``name-i-j`` by their places."""
    import pytest

    return [pytest.param(op, variant, id=f"{op.name}-{i}-{j}")
            for i, op in enumerate(ops) if op.name not in skip
            for j, variant in enumerate(op.variants)]


_DTYPE_NAMES = ("float16", "bfloat16", "float32")


def framework_replays(op, inputs, module, same, monkeypatch, calls: int = 3):
    """`calls` calls of an op-table op on a framework's arrays, each on new inputs
    (`inputs()` -> the CuPy call's args and kwargs, the framework's args and kwargs) with the
    framework's own dtypes as arguments (`module.bfloat16`) and a new seed each call, each
    compared by `same` with the same call on CuPy arrays, made after it. Returns the
    modules of the calls that went the whole way leaving a replay (`whole_ways`), the set of
    the framework's output dtypes over the calls, and the last call's framework arguments."""
    seen = whole_ways(monkeypatch)
    dtypes = set()
    for call in range(calls):
        args, kwargs, fargs, fkw = inputs()
        args, kwargs = framework_call(args, kwargs, None, call)
        fargs, fkw = framework_call(fargs, fkw, module, call)
        got = op.fn(*fargs, **fkw)
        same(got, op.fn(*args, **kwargs))
        dtypes.add(tuple(g.dtype for g in (got if isinstance(got, tuple) else (got,))))
    return seen, dtypes, (fargs, fkw)


def framework_call(args, kwargs, module, call: int):
    """An op-table call's arguments with output dtypes named by strings (given by position
    or as `dtype=`) as a framework's own (`module.bfloat16`; None: the names kept), and its
    seed, if it has one, 1000 + call (a new seed each call)."""
    def own(v):
        if module is None or not (isinstance(v, str) and v in _DTYPE_NAMES):
            return v
        return getattr(module, v)

    kwargs = {k: own(v) if k == "dtype" else v for k, v in kwargs.items()}
    if "seed" in kwargs:
        kwargs["seed"] = 1000 + call
    return [own(a) for a in args], kwargs


def whole_ways(monkeypatch) -> list:
    """Forget every replay and record each call that goes the whole way leaving one (by the
    module of its first argument's type) in the list returned."""
    from cuquant._core import replay as _fast

    seen = []
    first = _fast._first

    def counted(op, key, args, kwargs):
        seen.append(type(args[0]).__module__)
        return first(op, key, args, kwargs)

    monkeypatch.setattr(_fast, "_first", counted)
    _fast.clear()
    return seen
