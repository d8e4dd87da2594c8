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
