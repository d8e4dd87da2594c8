"""The group-wise integer kernels (DeepSpeed format, INT4 per group, batched dequantization,
zero point with stochastic rounding) against the NumPy backend, bit for bit: many shapes,
group sizes (1 to 131072, odd ones included), bit widths, dtypes, fast and general paths,
edge values, inputs next to rounding boundaries, one launch for a batch and its speed,
torch arrays, streams, and tensors above 2**31 elements.
Run on a CUDA machine: `python -m pytest -m gpu tests/_cuda/test_groupwise_gpu.py`."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cuquant as cq
from _util import assert_same_bits
from cuquant import _numpy
from cuquant._core import replay as _fast
from cuquant._cuda import groups as gw
from cuquant._cuda import groupwise as ds
from cuquant._cuda import launch
from cuquant._core.dtypes import FLOATS
from test_gpu import built_kernels  # noqa: F401 - a fixture
from cuquant._numpy.groupwise import group_multipliers
from cuquant.zero_point import random_bits

pytestmark = pytest.mark.gpu

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
OUTS = tuple(DTYPES)


def _cp():
    import cupy

    return cupy


def dev(a, unaligned=False):
    """A CuPy copy of a; `unaligned` puts it 2 bytes past a 16-byte boundary, which sends
    the kernels down their general (scalar) path."""
    cp = _cp()
    a = np.ascontiguousarray(a)
    if not unaligned:
        return cp.asarray(a)
    step = max(1, 2 // a.itemsize)
    buf = cp.empty(a.size + 16, dtype=a.dtype)
    view = buf[step:step + a.size]
    view[...] = cp.asarray(a.reshape(-1))
    return view.reshape(a.shape)


def edge_values(rng, n: int, dtype, g: int) -> np.ndarray:
    """Values over six decades with, in a few whole groups, zeros, -0, a constant, a NaN,
    +-inf, subnormals, a mix of zeros, a far offset."""
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 2, n)).astype(np.float32)
    groups = n // g
    tiny = {np.dtype(np.float16): 2.0 ** -24, np.dtype(np.float32): 1e-41}.get(np.dtype(dtype), 1e-39)
    for i, c in zip(rng.choice(groups, size=min(groups, 9), replace=False), range(9)):
        s = slice(i * g, (i + 1) * g)
        v = x[s]
        if c == 0:
            v[:] = 0.0
        elif c == 1:
            v[:] = -0.0
        elif c == 2:
            v[:] = 3.5
        elif c == 3:
            v[rng.integers(0, g)] = np.nan
        elif c == 4:
            v[rng.integers(0, g)] = np.inf
        elif c == 5:
            v[rng.integers(0, g)] = -np.inf
        elif c == 6:
            v[:] = rng.integers(-1000, 1000, g) * tiny
        elif c == 7:
            v[:] = np.where(rng.random(g) < 0.5, 0.0, -0.0)
        else:
            v[:] += 1000.0
    return x.astype(dtype)


# ---------------------------------------------------------------------------------------
# DeepSpeed format: quantize and dequantize

GROUP_CASES = [((4, 256), 128), ((2, 4096), 2048), ((3, 40), 24), ((2, 136), 136), ((6,), 1),
               ((4, 6), 6), ((2, 20000), 20000), ((1, 65536), 65536), ((2, 3, 10), 3),
               ((5, 14), 7), ((3, 200), 100), ((4, 8), 8), ((2, 64), 16), ((3, 1026), 513),
               ((2, 4096), 4096), ((1, 8192), 8192), ((1, 16384), 16384), ((2, 512), 512),
               ((1, 32768), 32768), ((1, 131072), 131072), ((37, 7168), 128), ((64, 2048), 2048)]


@pytest.mark.parametrize("shape,g", GROUP_CASES, ids=[f"{s}-g{g}" for s, g in GROUP_CASES])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_groupwise_matches_numpy(shape, g, dtype, rng):
    n = int(np.prod(shape))
    for bits, sym, unaligned in itertools.product((4, 8), (False, True), (False, True)):
        x = edge_values(rng, n, DTYPES[dtype], g).reshape(shape)
        what = f"{shape} g={g} {dtype} bits={bits} sym={sym} unaligned={unaligned}"
        q, p = cq.quantize_groupwise(dev(x, unaligned), bits, sym, g)
        qh, ph = _numpy.quantize_groupwise(x, bits, sym, g)
        assert_same_bits(q, qh, what + " codes")
        assert_same_bits(p, ph, what + " params")
        for out in OUTS:
            y = cq.dequantize_groupwise(dev(qh, unaligned), dev(ph), bits, sym, g, out)
            assert_same_bits(y, _numpy.dequantize_groupwise(qh, ph, bits, sym, g, out),
                             what + f" dequantize to {out}")


ZP_ROUNDINGS = (("nearest", None), ("stochastic", "rbits"), ("stochastic", "seed"))


def _words(rng, shape, source, unaligned: bool):
    """The random words' arguments (rbits=, seed= or none) of the device call and of the
    host's, for x of `shape`."""
    if source == "rbits":
        r = rng.integers(0, 1 << 32, size=shape, dtype=np.uint32)
        return {"rbits": dev(r, unaligned)}, {"rbits": r}
    if source == "seed":
        seed = {"seed": int(rng.integers(0, 1 << 63))}
        return seed, seed
    return {}, {}


def _zero_point_inputs(rng, shape, dtype: str, g: int, source, unaligned: bool):
    """x [M, K] with edge values, and the random words' arguments (_words)."""
    x = edge_values(rng, int(np.prod(shape)), DTYPES[dtype], g).reshape(shape)
    return (x, *_words(rng, shape, source, unaligned))


# Small groups off the fast path (quantize_groups_small: 256 groups a block, a thread
# each): more than one block's groups and a last block partly filled, group sizes up to
# the largest whose block fits 48 KB of shared memory (63 for 16-bit inputs, 38 for
# float32), odd ones whose 4-bit codes share a byte with the next group's, inputs aligned
# and not, edge values. Each case checks that the small-group kernel ran.
SMALL_CASES = [((37, 820), 20), ((5, 300), 1), ((11, 780), 3), ((9, 1020), 6), ((40, 266), 38),
               ((33, 504), 63), ((300, 64), 32)]


def _planned_small(g: int) -> bool:
    return any(k[0] == "quant-small" and k[4] == g for k in gw._plans)


@pytest.mark.parametrize("shape,g,dtype", [
    pytest.param(shape, g, dtype, id=f"{shape}-g{g}-{dtype}") for (shape, g), dtype
    in itertools.product(SMALL_CASES, DTYPES)
    if gw.small_smem_bytes(g, np.dtype(DTYPES[dtype]).itemsize) <= cq.DEFAULT_POLICY.small_smem])
def test_small_groups_match_numpy(shape, g, dtype, rng):
    t = DTYPES[dtype]
    n = int(np.prod(shape))
    fast = g % (16 // np.dtype(t).itemsize) == 0   # whole 16-byte units: aligned, the fast path
    for bits, sym, unaligned in itertools.product((4, 8), (False, True), (False, True)):
        if fast and not unaligned:
            continue
        x = edge_values(rng, n, t, g).reshape(shape)
        what = f"{shape} g={g} {dtype} bits={bits} sym={sym} unaligned={unaligned}"
        launch.clear_plans()
        q, p = cq.quantize_groupwise(dev(x, unaligned), bits, sym, g)
        assert _planned_small(g), what + ": the small-group kernel did not run"
        qh, ph = _numpy.quantize_groupwise(x, bits, sym, g)
        assert_same_bits(q, qh, what + " codes")
        assert_same_bits(p, ph, what + " params")
    if dtype == "float32" or shape[1] % g:
        return
    for bits, (rounding, source), unaligned in itertools.product((4, 8), ZP_ROUNDINGS,
                                                                  (False, True)):
        if fast and not unaligned:
            continue
        x, kw, kwh = _zero_point_inputs(rng, shape, dtype, g, source, unaligned)
        what = (f"zero point {shape} g={g} {dtype} bits={bits} {rounding} {source} "
                f"unaligned={unaligned}")
        launch.clear_plans()
        got = cq.quantize_groupwise_zero_point(dev(x, unaligned), bits, g, rounding, **kw)
        assert _planned_small(g), what + ": the small-group kernel did not run"
        want = cq.quantize_groupwise_zero_point(x, bits, g, rounding, **kwh)
        for name, a, b in zip(("codes", "scales", "zeros", "dequant"), got, want):
            assert_same_bits(a, b, f"{what} {name}")


def _check_dequantizers(rng, cases, policy=cq.DEFAULT_POLICY):
    """Every group-wise dequantizer (DeepSpeed's four, the zero point's two) of codes from
    edge values, to every output dtype, against the host's, bit for bit: for each case
    ((shape, group size)) and output, six calls in that order, under `policy`."""
    for (shape, g), out in itertools.product(cases, OUTS):
        x = edge_values(rng, int(np.prod(shape)), np.float16, g).reshape(shape)
        for bits, sym in itertools.product((4, 8), (False, True)):
            qh, ph = _numpy.quantize_groupwise(x, bits, sym, g)
            y = cq.dequantize_groupwise(dev(qh), dev(ph), bits, sym, g, out, policy=policy)
            assert_same_bits(y, _numpy.dequantize_groupwise(qh, ph, bits, sym, g, out),
                             f"{shape} g={g} bits={bits} sym={sym} to {out}")
        for bits in (4, 8):
            qh, sh, zh, _ = cq.quantize_groupwise_zero_point(x, bits, g)
            y = cq.dequantize_groupwise_zero_point(dev(qh), dev(sh), dev(zh), g, out,
                                                   policy=policy)
            assert_same_bits(y, cq.dequantize_groupwise_zero_point(qh, sh, zh, g, out),
                             f"{shape} g={g} zero point bits={bits} to {out}")


# Groups of 4 or more 16-byte units of output share their parameters within a warp: unit
# counts that are not a multiple of a warp's 64, groups straddling a warp's run (5, 6, 17,
# 34 units), groups of exactly 4 units, one warp's run and less.
WARP_CASES = [((37, 992), 32), ((5, 1088), 136), ((3, 40), 40), ((7, 48), 48), ((3, 48), 24),
              ((9, 4096), 2048), ((1, 64), 64), ((130, 4096), 128), ((2, 1000), 8)]


def _dequantizers_built(built, prefix: str):
    """(output type, units of output a vector, the expression's last parameters) of each
    group-wise dequantizer among the name expressions `built`, of the kernel `prefix`."""
    by_cxx = {t.cxx: t for t in FLOATS.values()}
    found = []
    for e in built:
        if e.startswith(prefix + "<"):
            out, vec, *rest = e[:-1].rsplit(", ", 4)[-4:]  # the format's codes may hold ", "
            found.append((by_cxx[out], int(vec), rest))
    return found


def test_dequantizers_sharing_a_warps_parameters(rng, built_kernels):
    picked = []
    for shape, g in WARP_CASES:
        del built_kernels[:]
        _check_dequantizers(rng, [(shape, g)])
        for out, vec, (_, warp) in _dequantizers_built(built_kernels, "cq::dequantize_groups"):
            d = g // vec  # units of a group on the fast path
            picked.append((warp == "true", out.name, d if vec == out.vector_width else 0))
    # Every call planned its launch, each with the kernel its groups call for.
    assert len(picked) == len(WARP_CASES) * len(OUTS) * 6
    for warp, out, d in picked:
        assert warp == (d >= gw.WARP_MIN_UNITS), (out, d)
    assert sum(w for w, _, _ in picked) > len(picked) // 2


# Groups that are not whole 16-byte units of output, aligned codes: 16-byte units that span
# two groups (G >= the unit) or up to one group an element (G below it), units over many
# blocks, the elements after the last whole unit (n % 8, n below one unit), edge values.
# Each case checks that the spanning kernel ran; with it off, the general path gives the
# same bits.
SPANNING_CASES = [((37, 820), 20), ((5, 300), 1), ((11, 780), 3), ((9, 1020), 6),
                  ((33, 504), 63), ((3, 1026), 513), ((7, 700), 100), ((1, 6), 3),
                  ((3, 10), 5), ((2, 4100), 4100), ((64, 7180), 20)]


@pytest.mark.parametrize("spanning", [True, False])
def test_dequantizers_spanning_groups(spanning, rng, built_kernels):
    picked = []
    policy = cq.KernelPolicy(spanning=spanning)
    for shape, g in SPANNING_CASES:
        del built_kernels[:]
        _check_dequantizers(rng, [(shape, g)], policy)
        picked += [(out.name, g) for out, _, _ in
                   _dequantizers_built(built_kernels, "cq::dequantize_groups_spanning")]
    # Six calls (four DeepSpeed, two zero point) for each case and output whose groups are
    # not whole units of that output.
    assert picked == [(out, g) for (_, g), out in itertools.product(SPANNING_CASES, OUTS)
                      if spanning and g % (16 // np.dtype(DTYPES[out]).itemsize)
                      for _ in range(6)]


@pytest.mark.parametrize("g", [32, 128, 6])
def test_int4_per_group_matches_numpy(g, rng):
    w = (rng.standard_normal((96, 768)) * 0.05).astype(np.float16)
    packed, params = cq.quantize_int4_per_group(dev(w), group_size=g)
    ph, pah = _numpy.quantize_int4_per_group(w, g)
    assert_same_bits(packed, ph)
    assert_same_bits(params, pah)
    back = cq.dequantize_int4_per_group(packed, params, "bfloat16", group_size=g)
    assert_same_bits(back, _numpy.dequantize_int4_per_group(ph, pah, "bfloat16", g))


def _near_boundaries(rng, groups: int, g: int, bits: int, sym: bool) -> np.ndarray:
    """float32 groups whose products (x - offset) * mult sit within 2 ulps of k + 1/2:
    each group holds its extremes (so mult and offset are known) and elsewhere
    f32((k + 1/2) / mult + offset) moved by -2..2 ulps."""
    half = 1 << (bits - 1)
    out = np.empty((groups, g), np.float32)
    for i in range(groups):
        m = np.float32(rng.uniform(0.5, 2.0) * 10.0 ** rng.integers(-6, 6))
        if sym:
            lo, hi = -m, m
            mult, off = np.float32(2 ** bits) / (m * np.float32(2)), np.float32(0)
        else:
            lo = np.float32(-m * rng.uniform(0.2, 1.5))
            hi = m
            mult = np.float32(2 ** bits) / (hi - lo)
            off = (hi + lo) * np.float32(0.5)
        k = rng.integers(-half, half - 1, g) + 0.5
        x = (k / np.float64(mult) + np.float64(off)).astype(np.float32)
        x = (x.view(np.int32) + rng.integers(-2, 3, g).astype(np.int32)).view(np.float32)
        x = np.clip(x, lo, hi)
        x[0], x[-1] = lo, hi
        out[i] = x
    return out


@pytest.mark.parametrize("bits,sym", list(itertools.product((4, 8), (False, True))))
def test_groupwise_near_rounding_boundaries(bits, sym, rng):
    for g in (128, 2048, 24):
        x = _near_boundaries(rng, 64, g, bits, sym)
        q, p = cq.quantize_groupwise(dev(x), bits, sym, g)
        qh, ph = _numpy.quantize_groupwise(x, bits, sym, g)
        assert_same_bits(q, qh, f"g={g} codes")
        assert_same_bits(p, ph, f"g={g} params")


def _narrow_groups(rng, groups: int, g: int, dtype) -> np.ndarray:
    """Groups of one sign whose values lie 0-3 units of the last place above a base drawn
    uniformly over the finite bit patterns (every binade, subnormals, binade edges), the
    extremes present in each group."""
    t = np.dtype(dtype)
    u = {2: np.uint16, 4: np.uint32}[t.itemsize]
    top = int(np.array(np.inf, dtype=t).view(u)) - 4   # below inf's pattern
    base = rng.integers(0, top, groups, dtype=np.int64)
    step = rng.integers(0, 4, (groups, g))
    step[:, 0], step[:, -1] = 0, 3
    sign = np.where(rng.random(groups) < 0.5, 0, 1 << (8 * t.itemsize - 1))
    return ((base[:, None] + step) | sign[:, None]).astype(u).view(t)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_groupwise_narrow_groups(dtype, rng):
    """Groups a few ulps wide. For 16-bit inputs the kernels skip the lower clamp of the
    asymmetric codes (groupwise.cu: (x - offset) * mult cannot fall below -2**(BITS-1)
    by more than rounding); float32 inputs keep it, and here they need it: hi + lo rounds
    by up to hi - lo, and lo's quotient reaches -2**BITS. The staged kernel (1 MB and up),
    the register-held one and the small-group one (G=20) run."""
    t = DTYPES[dtype]
    for (groups, g), bits, sym in itertools.product(((64, 128), (8192, 128), (1024, 2048),
                                                     (2000, 20)),
                                                    (4, 8), (False, True)):
        x = _narrow_groups(rng, groups, g, t)
        what = f"{dtype} groups={groups} g={g} bits={bits} sym={sym}"
        q, p = cq.quantize_groupwise(dev(x), bits, sym, g)
        qh, ph = _numpy.quantize_groupwise(x, bits, sym, g)
        assert_same_bits(q, qh, what + " codes")
        assert_same_bits(p, ph, what + " params")
        if dtype == "float32" and not sym:
            lo, hi = x.min(axis=1), x.max(axis=1)
            mult, off = group_multipliers(lo, hi, bits, False)
            with np.errstate(all="ignore"):
                v = ((lo - off).astype(np.float32) * mult).astype(np.float32)
            clamped = np.isfinite(mult) & np.isfinite(off) & (v < -(1 << (bits - 1)) - 0.5)
            assert clamped.any(), what + ": no group needed the lower clamp"


# ---------------------------------------------------------------------------------------
# Zero point, nearest and stochastic

ZP_CASES = [((4, 256), 128), ((3, 96), 32), ((2, 512), 256), ((3, 12), 3), ((2, 12), 6),
            ((2, 4096), 2048), ((1, 20000), 20000), ((2, 20), 1), ((1, 8192), 4096),
            ((130, 4096), 128), ((2, 1024), 512), ((7, 768), 64)]


def zero_point_results(shape, g, dtype, rng, **mode):
    """Every bit width, rounding and alignment of the zero-point quantizer at `shape` and
    group `g` (with `mode`, e.g. symmetric=True) on the GPU, checked bit for bit against
    the NumPy backend; yields (what, bits, unaligned, the NumPy results)."""
    for bits, (rounding, source), unaligned in itertools.product((4, 8), ZP_ROUNDINGS,
                                                                  (False, True)):
        x, kw, kwh = _zero_point_inputs(rng, shape, dtype, g, source, unaligned)
        what = f"{shape} g={g} {dtype} bits={bits} {rounding} {source} unaligned={unaligned}"
        got = cq.quantize_groupwise_zero_point(dev(x, unaligned), bits, g, rounding, **mode,
                                               **kw)
        want = cq.quantize_groupwise_zero_point(x, bits, g, rounding, **mode, **kwh)
        for name, a, b in zip(("codes", "scales", "zeros", "dequant"), got, want):
            assert_same_bits(a, b, f"{what} {name}")
        yield what, bits, unaligned, want


@pytest.mark.parametrize("shape,g", ZP_CASES, ids=[f"{s}-g{g}" for s, g in ZP_CASES])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_zero_point_matches_numpy(shape, g, dtype, rng):
    for what, _, unaligned, want in zero_point_results(shape, g, dtype, rng):
        for out in OUTS:
            y = cq.dequantize_groupwise_zero_point(dev(want[0], unaligned), dev(want[1]),
                                                   dev(want[2]), g, out)
            assert_same_bits(y, cq.dequantize_groupwise_zero_point(*want[:3], g, out),
                             f"{what} dequantize to {out}")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_zero_point_near_rounding_boundaries(bits, dtype, rng):
    """Quotients x / s next to every boundary a code can turn on: x at j + 1/2 steps of
    its group's s, moved -2..2 units of its last place (nearest), and random words whose
    top 24 bits sit at floor(frac(x / s) * 2**24) - 1 .. + 1 (stochastic), with tiny
    negative quotients near -2**-25 (where 1 - |x / s| rounds either way). A quotient one
    unit off in its last place changes some code here."""
    t = DTYPES[dtype]
    f32 = np.float32
    m, g, qmax = 256, 128, (1 << bits) - 1
    lo = (-rng.uniform(0.5, 2, m) * 10.0 ** rng.integers(-3, 3, m)).astype(t).astype(f32)
    hi = (rng.uniform(0.5, 2, m) * 10.0 ** rng.integers(-3, 3, m)).astype(t).astype(f32)
    s = (np.maximum(hi - lo, f32(1e-5)) / f32(qmax)).astype(f32).astype(t).astype(f32)
    j = rng.integers(-qmax, qmax, (m, g)) + 0.5
    x = (j * s[:, None].astype(np.float64)).astype(f32).astype(t)
    x[::4, 2:6] = (-(2.0 ** -25) * s[::4, None]).astype(f32).astype(t)
    bits16 = x.view(np.uint16)
    top = int(np.array(ml_dtypes.finfo(t).max, t).view(np.uint16))
    mag = np.clip((bits16 & 0x7FFF).astype(np.int32) + rng.integers(-2, 3, (m, g)), 0, top)
    x = ((bits16 & 0x8000) | mag.astype(np.uint16)).view(t)
    x = np.clip(x.astype(f32), lo[:, None], hi[:, None])
    x[:, 0], x[:, 1] = lo, hi
    x = x.astype(t)
    v = x.astype(f32) / s[:, None]
    frac = (v - np.floor(v)).astype(f32)
    r24 = np.floor(frac * f32(1 << 24)).astype(np.int64) + rng.integers(-1, 2, (m, g))
    rbits = ((np.clip(r24, 0, (1 << 24) - 1) << 8) | rng.integers(0, 256, (m, g))).astype(np.uint32)
    for rounding, kw in (("nearest", {}), ("stochastic", {"rbits": rbits})):
        got = cq.quantize_groupwise_zero_point(dev(x), bits, g, rounding,
                                               **{k: dev(a) for k, a in kw.items()})
        want = cq.quantize_groupwise_zero_point(x, bits, g, rounding, **kw)
        for name, a, b in zip(("codes", "scales", "zeros", "dequant"), got, want):
            assert_same_bits(a, b, f"{dtype} bits={bits} {rounding} {name}")


# A group size for each quantizer of 16-bit data at 10 x 8 groups: the tile kernel, the
# one-pass kernel (too small for the staged one), the small-group kernel.
HUGE_CASES = {128: "quant-tiles", 512: "quant", 20: "quant-small"}


@pytest.mark.parametrize("g", list(HUGE_CASES))
def test_zero_point_huge_bfloat16_scales(g, rng, built_kernels):
    """bf16 groups from 1e30 to 1e38 wide: from about s = 2**104 on, M * s (M = 1.5 * 2**23,
    the fast reconstruction's constant) overflows float32, and such a group must take the
    careful arithmetic. Rows on both sides of that bound, every rounding, and the kernel
    the group size takes checked."""
    t, m = ml_dtypes.bfloat16, 10
    width = 10.0 ** np.linspace(30, 38, m)
    x = (rng.uniform(-1, 1, (m, 8 * g)) * width[:, None]).astype(np.float32).astype(t)
    for bits, (rounding, source) in itertools.product((4, 8), ZP_ROUNDINGS):
        kw, kwh = _words(rng, x.shape, source, False)
        got = cq.quantize_groupwise_zero_point(dev(x), bits, g, rounding, **kw)
        want = cq.quantize_groupwise_zero_point(x, bits, g, rounding, **kwh)
        what = f"g={g} bits={bits} {rounding} {source}"
        for name, a, b in zip(("codes", "scales", "zeros", "dequant"), got, want):
            assert_same_bits(a, b, f"{what} {name}")
        with np.errstate(over="ignore"):
            over = ~np.isfinite(np.float32(1.5 * 2 ** 23) * want[1].astype(np.float32))
        assert over.any() and not over.all(), what + ": no row on one side of the bound"
        assert np.isfinite(want[3].astype(np.float32)).all(), what
    assert HUGE_CASES[g] in {k[0] for k in gw._plans}, sorted({k[0] for k in gw._plans})


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("source_dtype", ["float16", "bfloat16"])
def test_zero_point_dequantize_any_scales_and_zeros(bits, source_dtype, rng):
    """Scales and zeros a caller may pass, not only the quantizer's: integer zeros on both
    sides of +-1024 (where the fp16 kernel leaves its half-precision pairs), -0, halves,
    huge, NaN and inf zeros; subnormal, negative, huge, zero, inf and NaN scales."""
    t = DTYPES[source_dtype]
    m, g = 64, 128
    zs = np.concatenate([np.arange(-1040, -1000), np.arange(-20, 20), np.arange(1000, 1040),
                         [-0.0, 0.5, -0.5, 1023.5, 2047.0, 2049.0, 60000.0, np.nan, np.inf,
                          -np.inf, 2.0 ** -24, 3.0 ** 5]]).astype(np.float32)
    specials = np.array([2.0 ** -24, 2.0 ** -20, -0.01, 65504.0, 300.0, 0.0, -0.0, np.inf,
                         -np.inf, np.nan, 1e-3], np.float32)
    n = 4096
    s = np.where(rng.random(n) < 0.3, rng.choice(specials, n), rng.uniform(1e-3, 1.0, n)).astype(t)
    for k in (256, 4096):
        groups = m * k // g
        scales = s[rng.integers(0, n, groups)].reshape(m, k // g)
        zeros = zs[rng.integers(0, zs.size, groups)].astype(t).reshape(m, k // g)
        codes = rng.integers(0, 256, (m, k // 2 if bits == 4 else k), dtype=np.uint8)
        for out in OUTS:
            got = cq.dequantize_groupwise_zero_point(dev(codes), dev(scales), dev(zeros), g, out,
                                                     bits=bits)
            want = cq.dequantize_groupwise_zero_point(codes, scales, zeros, g, out, bits=bits)
            assert_same_bits(got, want, f"bits={bits} {source_dtype} k={k} to {out}")


def test_seed_gives_the_same_codes_on_cpu_and_gpu(rng):
    x = (rng.standard_normal((33, 1024)) * 2).astype(ml_dtypes.bfloat16)
    for bits in (4, 8):
        a = cq.quantize_groupwise_zero_point(dev(x), bits, 128, "stochastic", seed=7)
        b = cq.quantize_groupwise_zero_point(x, bits, 128, "stochastic", seed=7)
        c = cq.quantize_groupwise_zero_point(dev(x), bits, 128, "stochastic",
                                             rbits=dev(random_bits(x.shape, 7)))
        for u, v, w in zip(a, b, c):
            assert_same_bits(u, v)
            assert_same_bits(w, v)


# ---------------------------------------------------------------------------------------
# Batched dequantization

def _batch(rng, sizes, groups, unaligned_every=2):
    items, host = [], []
    for i, (n, g) in enumerate(zip(sizes, itertools.cycle(groups))):
        bits, sym = (4, 8)[i % 2], bool((i // 2) % 2)
        n = max(2 * g, n // (2 * g) * 2 * g)
        x = edge_values(rng, n, np.float32, g)
        q, p = _numpy.quantize_groupwise(x, bits, sym, g)
        host.append((q, p, bits, sym, g))
        items.append((dev(q, unaligned_every and i % unaligned_every == 1), dev(p), bits, sym, g))
    return items, host


def _count_launches(gpu, monkeypatch) -> list:
    """A list that gets an entry for every kernel launch, by either of `Launch`'s entries
    (the batched kernel passes its table as one struct argument)."""
    calls = []
    for name in ("__call__", "with_struct"):
        original = getattr(gpu.Launch, name)

        def counted(self, *a, _original=original, **k):
            calls.append(1)
            return _original(self, *a, **k)

        monkeypatch.setattr(gpu.Launch, name, counted)
    return calls


def test_batched_matches_numpy_in_one_launch(rng, monkeypatch):
    from cuquant._cuda import launch as _gpu

    items, host = _batch(rng, [int(v) for v in rng.integers(100, 200000, 24)],
                         (128, 24, 1, 2048, 7, 136))
    calls = _count_launches(_gpu, monkeypatch)
    for out in OUTS:
        calls.clear()
        got = cq.dequantize_groupwise_batched(items, out)
        assert len(calls) == 1
        for i, (a, b) in enumerate(zip(got, _numpy.dequantize_groupwise_batched(host, out))):
            assert_same_bits(a, b, f"item {i} to {out}")


def test_batched_replays_match_numpy(rng, monkeypatch):
    """Three batches of the same shapes and alignments on fresh data: the second and third
    run the first one's replay (kept in the table), still in one launch, with the NumPy
    backend's bits."""
    from cuquant._core import arrays as _arrays
    from cuquant._core import replay as _fast
    from cuquant._cuda import launch as _gpu

    _arrays.cupy_module()
    _fast.clear()
    sizes = [int(v) for v in rng.integers(100, 200000, 12)]
    calls = _count_launches(_gpu, monkeypatch)
    for call in range(3):
        items, host = _batch(rng, sizes, (128, 24, 2048, 7))
        calls.clear()
        got = cq.dequantize_groupwise_batched(items, "bfloat16")
        assert len(calls) == 1 and len(_fast._table) == 1
        want = _numpy.dequantize_groupwise_batched(host, "bfloat16")
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same_bits(a, b, f"call {call} item {i}")


# ---------------------------------------------------------------------------------------
# Arrays, views and streams

def test_torch_in_torch_out(rng):
    torch = pytest.importorskip("torch")
    x = (torch.randn(129, 1024, device="cuda", dtype=torch.bfloat16) * 3)
    xh = x.float().cpu().numpy().astype(ml_dtypes.bfloat16)
    q, p = cq.quantize_groupwise(x, 4, False, 128)
    assert isinstance(q, torch.Tensor) and q.is_cuda and q.dtype == torch.int8
    qh, ph = _numpy.quantize_groupwise(xh, 4, False, 128)
    assert_same_bits(q, qh)
    assert_same_bits(p, ph)
    back = cq.dequantize_groupwise(q, p, 4, False, 128, torch.float16)
    assert back.dtype == torch.float16 and back.shape == x.shape and back.is_cuda
    packed, params = cq.quantize_int4_per_group(x)
    assert isinstance(packed, torch.Tensor) and packed.shape == (129, 512)
    out = cq.dequantize_groupwise_batched([(q, p, 4, False, 128), (packed, params, 4, False, 128)],
                                          torch.bfloat16)
    assert all(isinstance(o, torch.Tensor) and o.is_cuda for o in out)
    qz, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 128, "stochastic", seed=3)
    assert deq.dtype == torch.bfloat16 and qz.dtype == torch.uint8 and s.dtype == torch.bfloat16
    want = cq.quantize_groupwise_zero_point(xh, 4, 128, "stochastic", seed=3)
    for a, b in zip((qz, s, z, deq), want):
        assert_same_bits(a, b)
    r = rng.integers(0, 1 << 32, size=(129, 1024), dtype=np.uint32)
    got = cq.quantize_groupwise_zero_point(x, 8, 128, "stochastic", rbits=dev(r))
    assert isinstance(got[0], torch.Tensor)
    want = cq.quantize_groupwise_zero_point(xh, 8, 128, "stochastic", rbits=r)
    for a, b in zip(got, want):
        assert_same_bits(a, b)


def test_non_contiguous_input_and_stream(rng):
    cp = _cp()
    base = (rng.standard_normal((512, 300)) * 4).astype(np.float16)
    want = _numpy.quantize_groupwise(np.ascontiguousarray(base.T), 8, False, 128)
    got = cq.quantize_groupwise(dev(base).T, 8, False, 128)
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])
    s = cp.cuda.Stream(non_blocking=True)
    x = dev(base)
    got = cq.quantize_groupwise_zero_point(x, 4, 100, "stochastic", seed=5, stream=s)
    s.synchronize()
    for a, b in zip(got, cq.quantize_groupwise_zero_point(base, 4, 100, "stochastic", seed=5)):
        assert_same_bits(a, b)


# ---------------------------------------------------------------------------------------
# Above 2**31 elements (64-bit offsets): sampled groups against NumPy on those groups only

def _big_half(n: int, seed: int):
    cp = _cp()
    g = cp.random.default_rng(seed)
    return (g.standard_normal((n,), dtype=cp.float32) * 3).astype(cp.float16)


@pytest.mark.parametrize("bits,sym,g", [(8, False, 128), (4, True, 2048), (4, False, 3),
                                        (8, True, 6)])
def test_groupwise_above_2_31_elements(bits, sym, g, rng):
    cp = _cp()
    n = ((1 << 31) + (1 << 20)) // (2 * g) * (2 * g)
    x = _big_half(n, int(rng.integers(1 << 31)))
    q, p = cq.quantize_groupwise(x, bits, sym, g)
    y = cq.dequantize_groupwise(q, p, bits, sym, g, "bfloat16")
    span = 4 * g if g % 2 == 0 else 8 * g
    firsts = [0, (1 << 31) // span * span - span, (1 << 31) // span * span, n - span]
    for a in firsts:
        xs = x[a:a + span].get()
        qh, ph = _numpy.quantize_groupwise(xs, bits, sym, g)
        per = 2 if bits == 4 else 1
        assert_same_bits(q[a // per:(a + span) // per], qh, f"codes at {a}")
        assert_same_bits(p[a // g:(a + span) // g], ph, f"params at {a}")
        assert_same_bits(y[a:a + span], _numpy.dequantize_groupwise(qh, ph, bits, sym, g,
                                                                    "bfloat16"), f"dequant at {a}")
    del x, q, p, y
    cp.get_default_memory_pool().free_all_blocks()


def test_batched_and_zero_point_above_2_31_elements(rng):
    cp = _cp()
    k = 4096
    rows = (1 << 31) // k + 64
    x = _big_half(rows * k, int(rng.integers(1 << 31))).reshape(rows, k)
    seed = 11
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 128, "stochastic", seed=seed)
    boundary = (1 << 31) // k
    for r in (0, boundary - 1, boundary, rows - 2):
        xs = x[r:r + 2].get()
        want = cq.quantize_groupwise_zero_point(xs, 4, 128, "stochastic",
                                                rbits=random_bits(xs.shape, seed, offset=r * k))
        for name, a, b in zip(("codes", "scales", "zeros", "dequant"),
                              (q[r:r + 2], s[r:r + 2], z[r:r + 2], deq[r:r + 2]), want):
            assert_same_bits(a, b, f"zero point {name} at row {r}")
    back = cq.dequantize_groupwise_zero_point(q, s, z, 128, "float32")
    for r in (boundary - 1, rows - 2):
        assert_same_bits(back[r:r + 2], _numpy.dequantize_groupwise_zero_point(
            q[r:r + 2].get(), s[r:r + 2].get(), z[r:r + 2].get(), 128, "float32"))
    del q, s, z, deq, back
    # a batch whose second tensor is above 2**31 elements
    q8, p8 = cq.quantize_groupwise(x, 8, True, 24)
    small = x[:4].get()
    qs, ps = _numpy.quantize_groupwise(small, 4, False, 128)
    out = cq.dequantize_groupwise_batched([(dev(qs), dev(ps), 4, False, 128),
                                           (q8, p8, 8, True, 24)], "float16")
    assert_same_bits(out[0], _numpy.dequantize_groupwise(qs, ps, 4, False, 128, "float16"))
    n = rows * k
    for a in (0, (1 << 31) // 24 * 24 - 24, n - 48):
        qa = q8.reshape(-1)[a:a + 48].get()
        pa = p8[a // 24:a // 24 + 2].get()
        assert_same_bits(out[1].reshape(-1)[a:a + 48],
                         _numpy.dequantize_groupwise(qa, pa, 8, True, 24, "float16"), f"at {a}")
    del x, q8, p8, out
    cp.get_default_memory_pool().free_all_blocks()
