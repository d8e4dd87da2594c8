"""The zero-point quantizer's symmetric mode on the GPU, bit for bit against the NumPy
backend: every kernel a shape and group size take (tiles, one and two passes, groups held in
registers, small groups), both roundings, aligned and unaligned inputs with edge values,
quotients next to every rounding boundary (the clamped top code among them), and bf16 groups
wide enough to need the careful arithmetic. Run on a CUDA machine:
`python -m pytest -m gpu tests/_cuda/test_zero_point_gpu.py`."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from test_groupwise_gpu import (DTYPES, OUTS, SMALL_CASES, ZP_CASES, ZP_ROUNDINGS,
                                _words, dev,
                                zero_point_results)

import cuquant as cq
from _util import assert_same_bits
from cuquant._core import replay as _fast
from cuquant._cuda import groups as gw
from test_gpu import built_kernels  # noqa: F401 - a fixture

pytestmark = pytest.mark.gpu

CASES = ZP_CASES + SMALL_CASES[:3]


def _same(got, want, what):
    for name, a, b in zip(("codes", "scales", "zeros", "dequant"), got, want):
        assert_same_bits(a, b, f"{what} {name}")


@pytest.mark.parametrize("shape,g", CASES, ids=[f"{s}-g{g}" for s, g in CASES])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_symmetric_matches_numpy(shape, g, dtype, rng):
    for what, bits, _, want in zero_point_results(shape, g, dtype, rng, symmetric=True):
        assert (want[2].astype(np.float32) == (1 << (bits - 1))).all(), what
        for out in OUTS:
            y = cq.dequantize_groupwise_zero_point(dev(want[0]), dev(want[1]), dev(want[2]), g,
                                                   out)
            assert_same_bits(y, cq.dequantize_groupwise_zero_point(*want[:3], g, out),
                             f"{what} dequantize to {out}")


def test_symmetric_and_asymmetric_calls_do_not_share_a_replay(rng):
    """The symmetric flag is part of a call's key: alternating calls on one input keep
    their own results."""
    _fast.clear()
    x = rng.standard_normal((64, 1024)).astype(np.float16)
    d = dev(x)
    for sym in (False, True, False, True):
        got = cq.quantize_groupwise_zero_point(d, 4, 128, symmetric=sym)
        _same(got, cq.quantize_groupwise_zero_point(x, 4, 128, symmetric=sym), f"sym={sym}")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_symmetric_near_rounding_boundaries(bits, dtype, rng):
    """x at j + 1/2 steps of its group's stored s, moved -2..2 units in the last place,
    with +-amax in every group (+amax / s sits near (2**b - 1) / 2, whose rounding up is
    clamped), and random words at the stochastic comparison's edge."""
    t = DTYPES[dtype]
    f32 = np.float32
    m, g = 256, 128
    half = f32(((1 << bits) - 1) / 2)
    amax = (rng.uniform(0.5, 2, m) * 10.0 ** rng.integers(-3, 3, m)).astype(t).astype(f32)
    s = (amax / half).astype(f32).astype(t).astype(f32)
    j = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (m, g)) + 0.5
    x = (j * s[:, None].astype(np.float64)).astype(f32).astype(t)
    bits16 = x.view(np.uint16)
    top = int(np.array(ml_dtypes.finfo(t).max, t).view(np.uint16))
    mag = np.clip((bits16 & 0x7FFF).astype(np.int32) + rng.integers(-2, 3, (m, g)), 0, top)
    x = ((bits16 & 0x8000) | mag.astype(np.uint16)).view(t)
    x = np.clip(x.astype(f32), -amax[:, None], amax[:, None])
    x[:, 0], x[:, 1] = -amax, amax
    x = x.astype(t)
    v = x.astype(f32) / s[:, None]
    frac = (v - np.floor(v)).astype(f32)
    r24 = np.floor(frac * f32(1 << 24)).astype(np.int64) + rng.integers(-1, 2, (m, g))
    rbits = ((np.clip(r24, 0, (1 << 24) - 1) << 8) | rng.integers(0, 256, (m, g))).astype(np.uint32)
    for rounding, kw in (("nearest", {}), ("stochastic", {"rbits": rbits})):
        got = cq.quantize_groupwise_zero_point(dev(x), bits, g, rounding, symmetric=True,
                                               **{k: dev(a) for k, a in kw.items()})
        want = cq.quantize_groupwise_zero_point(x, bits, g, rounding, symmetric=True, **kw)
        _same(got, want, f"{dtype} bits={bits} {rounding}")
        assert_same_bits(want[1].astype(f32), s.reshape(m, 1), "the stored scales")


# A group size for each quantizer of 16-bit data at 10 x 8 groups (test_groupwise_gpu).
HUGE_CASES = {128: "quant-tiles", 512: "quant", 20: "quant-small"}


@pytest.mark.parametrize("g", list(HUGE_CASES))
def test_symmetric_huge_bfloat16_scales(g, rng, built_kernels):
    """bf16 groups of magnitude 1e30 to 1e38: s = amax / 7.5 passes 2**104, where the fast
    reconstruction's constant times s overflows float32 and the group takes the careful
    arithmetic; rows on both sides, every rounding, and the kernel the size takes."""
    t, m = ml_dtypes.bfloat16, 10
    width = 10.0 ** np.linspace(30, 38, m)
    x = (rng.uniform(-1, 1, (m, 8 * g)) * width[:, None]).astype(np.float32).astype(t)
    for bits, (rounding, source) in itertools.product((4, 8), ZP_ROUNDINGS):
        kw, kwh = _words(rng, x.shape, source, False)
        got = cq.quantize_groupwise_zero_point(dev(x), bits, g, rounding, symmetric=True, **kw)
        want = cq.quantize_groupwise_zero_point(x, bits, g, rounding, symmetric=True, **kwh)
        what = f"g={g} bits={bits} {rounding} {source}"
        _same(got, want, what)
        with np.errstate(over="ignore"):
            over = ~np.isfinite(np.float32(1.5 * 2 ** 23) * want[1].astype(np.float32))
        assert over.any() and not over.all(), what + ": no row on one side of the bound"
    assert HUGE_CASES[g] in {k[0] for k in gw._plans}, sorted({k[0] for k in gw._plans})
