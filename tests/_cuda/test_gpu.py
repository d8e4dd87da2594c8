"""GPU kernels against the NumPy backend, bit for bit: every declared op on many shapes,
dtypes and variants, edge values, inputs built to sit next to rounding boundaries,
non-contiguous inputs, torch and JAX arrays, streams, and a tensor above 2**31 elements.
Run on a CUDA machine: `python -m pytest -m gpu`."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import cuquant as cq
from _util import assert_same_bits
import op_table
from cuquant._core.dtypes import E4M3, FLOATS, INT8

pytestmark = pytest.mark.gpu

OPS = op_table.all_ops()
_BYTE_CODES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e8m0fnu))
VARIANT_SHAPES = ((37, 999), (130, 257), (64, 7168), (3, 16400))


def _name(op) -> str:
    return op.name + (f"-{op.notes}" if op.notes else "")


def _cases():
    for op in OPS:
        for shape in op.shapes:
            for dtype in op.dtypes:
                yield pytest.param(op, dtype, shape, op.variants[0], id=f"{_name(op)}-{dtype}-{shape}")
        for variant in op.variants[1:]:
            for shape in VARIANT_SHAPES:
                yield pytest.param(op, "bfloat16", shape, variant,
                                   id=f"{op.name}-bfloat16-{shape}-{variant}")


def _run_both(op, args, kwargs):
    """The op on NumPy inputs and on the same inputs as CuPy arrays."""
    import cupy as cp

    host = op.fn(*args, **kwargs)

    def dev(a):  # CuPy holds byte codes as uint8; batches are converted item by item
        if isinstance(a, (list, tuple)):
            return type(a)(dev(b) for b in a)
        if isinstance(a, dict):
            return {k: dev(b) for k, b in a.items()}
        if not isinstance(a, np.ndarray):
            return a
        return cp.asarray(a.view(np.uint8) if a.dtype in _BYTE_CODES else a)

    dev_args = [dev(a) for a in args]
    dev_kwargs = {k: dev(v) for k, v in kwargs.items()}
    return host, op.fn(*dev_args, **dev_kwargs)


def _compare(op, host, dev, what):
    host = host if isinstance(host, (tuple, list)) else (host,)
    dev = dev if isinstance(dev, (tuple, list)) else (dev,)
    assert len(host) == len(dev)
    for i, (h, d) in enumerate(zip(host, dev)):
        assert_same_bits(d, h, f"{what} output {i}")


@pytest.mark.parametrize("op,dtype,shape,variant", list(_cases()))
def test_matches_numpy(op, dtype, shape, variant, rng):
    args, kwargs = op.make(np, rng, shape, dtype, **variant)
    host, dev = _run_both(op, args, kwargs)
    _compare(op, host, dev, op.name)


# ---------------------------------------------------------------------------------------
# The benchmark's large shapes

LARGE_SHAPES = ((4096, 7168), op_table.HEADLINE)


def _large_cases():
    """Every INT8 and FP8 op in bfloat16: each variant at 4096 x 7168, the first also at
    the benchmark's headline shape; the microscaling ops' first variant at 4096 x 7168."""
    for op in OPS:
        if op.family == "microscaling":  # the first variant at 4096 x 7168
            yield pytest.param(op, LARGE_SHAPES[0], op.variants[0],
                               id=f"{_name(op)}-{LARGE_SHAPES[0]}-{op.variants[0]}")
        if op.family not in ("int8", "fp8"):
            continue
        for shape in LARGE_SHAPES:
            for variant in op.variants if shape == LARGE_SHAPES[0] else op.variants[:1]:
                yield pytest.param(op, shape, variant, id=f"{_name(op)}-{shape}-{variant}")


@pytest.mark.parametrize("op,shape,variant", list(_large_cases()))
def test_large_shapes_match_numpy(op, shape, variant, rng):
    """At the benchmark's shapes, where the row, block and tile kernels run their full
    grids. A quantizer's input holds a zero row, a NaN, infinities and a row of bfloat16
    subnormals, except per-tensor dynamic scaling's (and NVFP4's global amax), whose one
    scale a NaN would make NaN."""
    args, kwargs = op.make(np, rng, shape, "bfloat16", **variant)
    one_scale = ((op.name.endswith("per_tensor") and "scale" not in kwargs)
                 or (op.name == "quantize_nvfp4" and "global_amax" not in kwargs))
    if op.kind == "quantize" and not one_scale:
        x = args[0]
        x[1] = 0.0
        x[2, 7] = np.nan
        x[3, 4000], x[5, 130] = np.inf, -np.inf
        x[4] = np.float32(2.0 ** -130)  # subnormal in bfloat16
    host, dev = _run_both(op, args, kwargs)
    _compare(op, host, dev, op.name)


# ---------------------------------------------------------------------------------------
# Every geometry of the row kernels

def _row_lengths(exact_teams: bool, smooth: bool = False) -> list[int]:
    """Row lengths K (bfloat16, 8 elements a vector) at both ends of every geometry's range
    of vectors: each team size, whole-warp teams of any count included, is met with its
    last vectors full and with one vector more than the team before it can hold. `smooth`:
    the geometries of smooth_quant_rows (rows of up to 4096 vectors)."""
    from cuquant._cuda import symmetric as _symmetric

    if smooth:
        pick, every, top = _symmetric.smooth_geometry, _symmetric.smooth_geometries(), 4096
    else:
        pick, every, top = (lambda n: _symmetric.geometry(n, exact_teams),
                            _symmetric.geometries(exact_teams), 4097)
    ends: dict = {}
    for nvec in range(1, top + 1):
        g = pick(nvec)
        lo, hi = ends.get(g, (nvec, nvec))
        ends[g] = (min(lo, nvec), max(hi, nvec))
    assert set(ends) == set(every), "a geometry is never picked"
    return sorted({8 * n for lo, hi in ends.values() for n in (lo, hi)})


# SmoothQuant through smooth_quant_rows at every size, with its wide geometries (by default
# it is taken from 2**23 elements on, the wide geometries from 2**25; smaller problems take
# the general row kernel).
SMOOTH_ROWS = cq.KernelPolicy(smooth_rows_min_elements=0, smooth_wide_min_elements=0)


def smooth_kernels(built) -> list:
    """((threads a team, vectors a thread), FULL) of each smooth_quant_rows kernel among the
    name expressions `built` (see cuquant._cuda.kernels.recording)."""
    import re

    found = []
    for e in built:
        m = re.fullmatch(r"cq::smooth_quant_rows<[^,]+, \d+, (\d+), (\d+), (true|false)>", e)
        if m:
            found.append(((int(m[1]), int(m[2])), m[3] == "true"))
    return found


@pytest.fixture
def built_kernels():
    """Fresh launch plans for the test, and the list of the name expressions of the kernels
    its plans ask for, in order."""
    from cuquant._cuda import kernels, launch

    launch.clear_plans()
    with kernels.recording() as built:
        yield built
    launch.clear_plans()


@pytest.mark.parametrize("name", ["quantize_int8_per_channel", "quantize_fp8_per_row", "smooth_quant"])
def test_every_row_geometry(name, rng, built_kernels):
    picked = []  # smooth_quant_rows' (K, geometry, FULL) launched
    fn = getattr(cq, name)
    kwargs = {"policy": SMOOTH_ROWS} if name == "smooth_quant" else {}
    lengths = _row_lengths(exact_teams=name != "smooth_quant", smooth=name == "smooth_quant")
    if name == "smooth_quant":  # rows of 8n - 1 elements take the general row kernel
        lengths += [k - 1 for k in lengths if k > 8 and k <= 4096]
    for k in lengths:
        x = op_table.float_input(np, rng, (5, k), "bfloat16")
        args = (x, rng.uniform(0.25, 4.0, k).astype(np.float32)) if name == "smooth_quant" else (x,)
        del built_kernels[:]
        host, dev = _run_both(SimpleNamespace(fn=fn), args, kwargs)
        _compare(None, host, dev, f"{name} K={k}")
        picked += [[k, geom, full] for geom, full in smooth_kernels(built_kernels)]
    if name == "smooth_quant":  # FULL exactly where a row fills a team of whole warps
        for k, (tpg, vpt), full in picked:
            assert full == (tpg >= 32 and k == tpg * vpt * 8), (k, tpg, vpt, full)
        assert len({g for _, g, full in picked if full}) >= 18  # bf16 rows up to 20864 fit


# ---------------------------------------------------------------------------------------
# Edge values

def _edges(x: np.ndarray, rng, with_nan: bool) -> np.ndarray:
    """Rows of zeros, +-inf, subnormals, -0 and (optionally) NaN, in place of random rows."""
    x = x.copy()
    tiny = {np.dtype(np.float16): 1e-6, np.dtype(np.float32): 1e-40}.get(x.dtype, 1e-39)
    m = x.shape[0]
    if m < 8:
        return x
    x[0] = 0
    x[1, ::3] = np.inf
    x[2, 1::5] = -np.inf
    x[3] = (rng.standard_normal(x.shape[1]) * tiny).astype(x.dtype)
    x[4] = -0.0
    x[4, ::7] = tiny
    x[5, : x.shape[1] // 2] = 0
    if with_nan:
        x[6, x.shape[1] // 2] = np.nan
        x[7] = np.nan
    return x




def _compare_edge_rows(op, shape, dtype, variant, rng, what: str, policy=None) -> int:
    """The op on random inputs of `shape` with edge rows in place of random ones (without,
    then with NaN; where x is 2-D with 8 rows or more) against the NumPy backend, bit for
    bit, under `policy` (the default one when None). Returns the size of x."""
    for with_nan in (False, True):
        args, kwargs = op.make(np, rng, shape, dtype, **variant)
        if policy is not None:
            kwargs = dict(kwargs, policy=policy)
        x = args[0]
        if x.ndim == 2 and x.shape[0] >= 8:
            args = (_edges(x, rng, with_nan),) + tuple(args[1:])
        host, dev = _run_both(op, args, kwargs)
        _compare(op, host, dev, what)
    return x.size


QUANTIZERS = [op for op in OPS if op.kind == "quantize"]
SYMMETRIC_QUANTIZERS = [op for op in QUANTIZERS if op.family in ("int8", "fp8")]


EDGE_CASES = [pytest.param(op, dtype, id=f"{op.name}-{op.notes}-{dtype}")
              for op in QUANTIZERS for dtype in op.dtypes]


@pytest.mark.parametrize("with_nan", [False, True])
@pytest.mark.parametrize("op,dtype", EDGE_CASES)
def test_edge_values(op, dtype, with_nan, rng):
    for shape in ((16, 300), (260, 1024)):
        for variant in op.variants:
            args, kwargs = op.make(np, rng, shape, dtype, **variant)
            args = (_edges(args[0], rng, with_nan),) + tuple(args[1:])
            host, dev = _run_both(op, args, kwargs)
            _compare(op, host, dev, f"{op.name} {shape} {variant}")


# ---------------------------------------------------------------------------------------
# Quotients next to rounding boundaries (float32 inputs reach any quotient)

def _near_boundaries(shape, code, rng) -> np.ndarray:
    """float32 [M, K] with amax A at every 32nd column (so every group, block, tile and row
    has the same scale s), and elsewhere x = f32(t * s) moved by -2..2 ulps, where t is a
    rounding boundary of the code: k + 1/2 for int8, midpoints of e4m3 values for fp8."""
    a = np.float32(rng.uniform(0.5, 2.0) * 10.0 ** rng.integers(-6, 6))
    s = (a * code.inv_qmax).astype(np.float32)
    if code is INT8:
        t = np.arange(0, 127) + 0.5
    else:
        vals = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
                                .astype(np.float64)))
        vals = vals[np.isfinite(vals)]
        t = (vals[:-1] + vals[1:]) / 2
    m, k = shape
    pick = rng.choice(t, size=(m, k)) * rng.choice([-1.0, 1.0], size=(m, k))
    x = (pick * np.float64(s)).astype(np.float32)
    ulps = rng.integers(-2, 3, size=(m, k)).astype(np.int32)
    x = (x.view(np.int32) + ulps * np.where(x < 0, -1, 1).astype(np.int32)).view(np.float32)
    x[:, ::32] = a
    return x


@pytest.mark.parametrize("op", SYMMETRIC_QUANTIZERS,
                         ids=[f"{o.name}-{o.notes}" for o in SYMMETRIC_QUANTIZERS])
def test_near_rounding_boundaries(op, rng):
    # (the group-wise families have their own, in test_groupwise_gpu.py)
    code = INT8 if op.family == "int8" else E4M3
    for variant in op.variants:
        x = _near_boundaries((256, 1024), code, rng)
        args, kwargs = op.make(np, rng, x.shape, "float32", **variant)
        args = (x,) + tuple(args[1:])
        if op.name == "smooth_quant":
            args = (x, np.ones(x.shape[1], np.float32))
        host, dev = _run_both(op, args, kwargs)
        _compare(op, host, dev, f"{op.name} {variant}")


def _every_16_bit_quotient(fmt: str, rng) -> np.ndarray:
    """Rows [amax, x...]: amax every significand of the format in [1, 2), x every
    significand at every exponent gap 0..24 below it (x <= amax), random signs, each row
    scaled by a random power of two: every dividend and divisor the one-correction
    division meets (tests/_cuda/test_division.py), through the kernels themselves."""
    bits = 8 if fmt == "bfloat16" else 11
    sig = 1.0 + np.arange(1 << (bits - 1)) / (1 << (bits - 1))
    rows = []
    for gap in range(25):
        x = np.broadcast_to(sig * 2.0 ** -gap, (sig.size, sig.size)).copy()
        x[x > sig[:, None]] = 0
        rows.append(np.concatenate([sig[:, None], x], axis=1))
    x = np.concatenate(rows)
    x *= rng.choice([-1.0, 1.0], size=x.shape)
    span = (-100, 100) if fmt == "bfloat16" else (-4, 4)
    x *= 2.0 ** rng.integers(*span, size=(x.shape[0], 1))
    return x.astype(FLOATS[fmt].numpy)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_every_16_bit_quotient(fmt, rng):
    x = _every_16_bit_quotient(fmt, rng)
    for fn in (cq.quantize_int8_per_channel, cq.quantize_fp8_per_row, cq.quantize_int8_per_tensor):
        host, dev = _run_both(SimpleNamespace(fn=fn), (x,), {})
        _compare(None, host, dev, f"{fn.__name__} {fmt}")


def _static_scales(rng) -> list[float]:
    """float32 scales of every exponent with random significands, both edges of the
    reciprocal path (2**-60 and 2**126), and the scales only a device array can carry."""
    e = np.arange(-149, 128)
    sig = rng.uniform(1.0, 2.0, e.size)
    picked = [np.float32(np.ldexp(s, int(k))) for s, k in zip(sig, e)]
    edges = [2.0 ** -60, np.nextafter(np.float32(2.0 ** -60), np.float32(0)), 2.0 ** -61,
             2.0 ** 126, np.nextafter(np.float32(2.0 ** 126), np.float32(0)), 1.0,
             np.nextafter(np.float32(1.0), np.float32(2)), -0.0123, -2.0 ** -60, 0.0, -0.0,
             np.inf, -np.inf, np.nan, np.finfo(np.float32).smallest_subnormal]
    return [np.float32(v) for v in picked + edges]


def _largest_at_most(limit: float, t):
    """The largest finite magnitude of type t at most `limit` (a float64), or None."""
    info = ml_dtypes.finfo(t)
    if limit >= float(info.max):
        return t(info.max)
    with np.errstate(over="ignore", under="ignore"):
        v = np.float64(limit).astype(np.float32).astype(t)
    if np.float64(v) > limit:
        v = np.nextafter(v, t(0))
    return v if v > 0 else None


def _static_input(b, t, rng, shape=(32, 256)) -> np.ndarray:
    """x of type t next to every quotient midpoint k + 1/2 of scale b, -2..2 steps away;
    vectors with one element at or just above 127 |b|, 1000 |b|, and 2**100 |b| (the bound
    of the reciprocal path); NaN, inf, zeros, subnormals and the largest finite value in
    others."""
    info = ml_dtypes.finfo(t)
    steps = np.int16 if np.dtype(t).itemsize == 2 else np.int32
    with np.errstate(over="ignore", invalid="ignore"):  # scales of every size
        mid = (rng.integers(-127, 127, size=shape) + 0.5) * np.float64(abs(b))
        x = mid.astype(np.float32).astype(t)
        step = rng.integers(-2, 3, size=shape).astype(steps) * np.where(x < 0, -1, 1).astype(steps)
        x = (x.view(steps) + step).view(t)
    col = 1
    for limit in (127.0, 1000.0, 2.0 ** 100):
        top = _largest_at_most(limit * abs(np.float64(b)), t) if np.isfinite(b) else None
        if top is not None:
            with np.errstate(over="ignore"):  # above the largest finite value: inf
                up = np.nextafter(top, t(np.inf))
            x[0::4, col] = top
            x[1::4, col + 2] = -top
            x[2::4, col + 4] = up
            x[3::4, col + 6] = -up
        col += 32
    x[3::8, 99] = np.nan
    x[7::8, 101] = np.inf
    x[5::8, 103] = info.smallest_subnormal
    x[6::8, 105] = info.max
    x[4::8, 107] = 0
    x[4::8, 108] = -t(0)
    return x


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "float32"])
def test_int8_static_scale_every_path(fmt, rng):
    """INT8 against a given scale b: 16-byte vectors whose |x| are all at most 2**100 |b|
    (rounded toward zero) divide by the reciprocal of b and clamp, any other vector takes
    div.rn. Both against the NumPy backend, for scales of every exponent and the scales
    only a device array can carry (0, negative, inf, NaN)."""
    import cupy as cp

    from cuquant import _numpy

    t = FLOATS[fmt].numpy.type
    for b in _static_scales(rng):
        x = _static_input(b, t, rng)
        want = _numpy.quantize_int8_per_tensor(x, b)
        got = cq.quantize_int8_per_tensor(cp.asarray(x), scale=cp.asarray([b], cp.float32))
        _compare(None, want, got, f"int8 static {fmt} scale {float(b)!r}")


def test_division_against_div_rn(rng):
    """The kernels' division by a group-shared divisor against IEEE division (div.rn.f32) on
    10**7 pairs with |a| <= 448 |b| (what a dynamic scale guarantees): random, next to
    quotient midpoints, divisors of every magnitude including subnormals. Quotients down to
    2**-24 match to the bit; below that (where a remainder may underflow) the int8 and fp8
    codes still match, which is all the quotient is used for."""
    import cupy as cp

    from cuquant._cuda import kernels as _kernels

    src = _kernels.source("common.cuh") + r"""
extern "C" __global__ void check_divide(const float* a, const float* b, unsigned* bad, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    cq::DivPlan p = cq::plan_division(b[i]);
    float fast = cq::divide(a[i], p), ref = cq::div_rn(a[i], b[i]);
    bool big = (cq::f2u(ref) & 0x7fffffffu) >= 0x33800000u;  // |ref| >= 2**-24, or inf / NaN
    if (big && cq::f2u(fast) != cq::f2u(ref) && !(cq::is_nan(fast) && cq::is_nan(ref)))
        atomicAdd(&bad[0], 1u);
    if (cq::CodeInt8::encode(fast) != cq::CodeInt8::encode(ref)) atomicAdd(&bad[1], 1u);
    if (cq::CodeE4M3::encode(fast) != cq::CodeE4M3::encode(ref)) atomicAdd(&bad[2], 1u);
}
"""
    fn = cp.RawModule(code=src, options=("-std=c++17",)).get_function("check_divide")
    n = 10_000_000
    g = cp.random.default_rng(int(rng.integers(1 << 31)))
    # divisors of every magnitude, subnormals included, made from random bits
    exponent = g.integers(0, 253, n).astype(cp.uint32)
    mantissa = g.integers(0, 1 << 23, n).astype(cp.uint32)
    b = ((exponent << 23) | mantissa | (exponent == 0)).view(cp.float32)
    # dividends with |a| <= 448 |b|: quotients on the half-integer grid and random ones,
    # moved by a few ulps so that they straddle every rounding boundary
    q = g.uniform(-448, 448, n, dtype=cp.float32)
    q[: n // 2] = cp.round(q[: n // 2] * 2) / 2
    a = (q.astype(cp.float64) * b.astype(cp.float64)).astype(cp.float32)
    a = (a.view(cp.int32) + g.integers(-3, 4, n).astype(cp.int32)).view(cp.float32)
    # keep the contract |a| <= 448 |b| (checked in float64, where nothing overflows)
    ok = cp.abs(a.astype(cp.float64)) <= 448 * cp.abs(b.astype(cp.float64))
    a = cp.where(ok & cp.isfinite(a), a, b)
    bad = cp.zeros(3, dtype=cp.uint32)
    fn(((n + 255) // 256,), (256,), (a, b, bad, np.int64(n)))
    assert bad.get().tolist() == [0, 0, 0]  # bits, int8 codes, fp8 codes


def test_division_by_reciprocal_against_div_rn(rng):
    """SmoothQuant's division of a float32 x by smooth[k] from RN(1/smooth[k]) with two
    corrections (common.cuh, divide_by_reciprocal) against div.rn.f32 on 10**7 pairs:
    divisors of random bits with |b| in [2**-32, 2**32], dividends of random bits at every
    exponent. Where the kernel relies on it (|a| >= 2**-100, 2**-125 <= |a / b| <= 2**100)
    every quotient matches to the bit; where it does not but |a / b| < 2**-68, the
    quotient stays below 2**-67, with one correction or two."""
    import cupy as cp

    from cuquant._cuda import kernels as _kernels

    src = _kernels.source("common.cuh") + r"""
extern "C" __global__ void check(const float* a, const float* b, unsigned* bad, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float nb = cq::u2f(cq::f2u(b[i]) ^ 0x80000000u), y = cq::rcp_rn(b[i]);
    float fast = cq::divide_by_reciprocal<2>(a[i], nb, y), ref = cq::div_rn(a[i], b[i]);
    unsigned ma = cq::f2u(a[i]) & 0x7fffffffu, mq = cq::f2u(ref) & 0x7fffffffu;
    if (ma >= 0x0d800000u && mq >= 0x01000000u && mq <= 0x71800000u) {  // the exact domain
        atomicAdd(&bad[2], 1u);
        if (cq::f2u(fast) != cq::f2u(ref)) atomicAdd(&bad[0], 1u);
    } else if (mq < 0x1d800000u) {  // a tiny quotient must stay tiny
        float one = cq::divide_by_reciprocal<1>(a[i], nb, y);
        if ((cq::f2u(fast) & 0x7fffffffu) >= 0x1e000000u || (cq::f2u(one) & 0x7fffffffu) >= 0x1e000000u)
            atomicAdd(&bad[1], 1u);
    }
}
"""
    fn = cp.RawModule(code=src, options=("-std=c++17",)).get_function("check")
    n = 10_000_000
    g = cp.random.default_rng(int(rng.integers(1 << 31)))
    b_exp = g.integers(127 - 32, 127 + 33, n).astype(cp.uint32)
    b = ((b_exp << 23) | g.integers(0, 1 << 23, n).astype(cp.uint32)).view(cp.float32)
    b[b_exp == 127 + 32] = cp.float32(2.0 ** 32)       # the range ends exactly
    b[b_exp == 127 - 32] = cp.float32(2.0 ** -32)
    a = g.integers(0, 0x7f800000, n).astype(cp.uint32)  # every finite magnitude
    a = (a | (g.integers(0, 2, n).astype(cp.uint32) << 31)).view(cp.float32)
    b = b * cp.where(g.integers(0, 2, n) == 1, 1, -1).astype(cp.float32)
    # half of the pairs with quotients near the top of the exact domain and near 2**-68
    h = n // 4
    a[:h] = (g.uniform(0.5, 2, h) * 2.0 ** 100 * b[:h].astype(cp.float64)).astype(cp.float32)
    a[h:2 * h] = (g.uniform(0.25, 4, h) * 2.0 ** -68 * b[h:2 * h].astype(cp.float64)).astype(cp.float32)
    bad = cp.zeros(3, dtype=cp.uint32)
    fn(((n + 255) // 256,), (256,), (a, b, bad, np.int64(n)))
    bad = bad.get().tolist()
    assert bad[:2] == [0, 0]  # mismatches in the exact domain, tiny quotients grown
    assert bad[2] > n // 3    # the exact domain was well covered


@pytest.mark.parametrize("bits", [8, 11])
def test_division_by_reciprocal_every_16_bit_dividend(bits):
    """One correction divides a bfloat16 (8 significant bits) or float16 (11) x by any b
    exactly: every significand of x in [1, 2) against every float32 significand of b in
    [1, 2), both binades of the quotient. Scaling x and b by powers of two scales every
    step exactly while all stays normal, so this covers SmoothQuant's whole fast domain.
    Without the correction the same check sees mismatches."""
    import cupy as cp

    from cuquant._cuda import kernels as _kernels

    src = _kernels.source("common.cuh") + r"""
extern "C" __global__ void check(int bits, unsigned* bad) {
    unsigned m = blockIdx.x * blockDim.x + threadIdx.x;  // b's 23 fraction bits
    if (m >= (1u << 23)) return;
    float b = cq::u2f(0x3f800000u | m), nb = -b, y = cq::rcp_rn(b);
    unsigned n0 = 0, n1 = 0;
    for (unsigned k = 0; k < (1u << (bits - 1)); ++k) {
        float a = cq::u2f(0x3f800000u | (k << (24 - bits)));
        unsigned ref = cq::f2u(cq::div_rn(a, b));
        n0 += cq::f2u(cq::divide_by_reciprocal<0>(a, nb, y)) != ref;
        n1 += cq::f2u(cq::divide_by_reciprocal<1>(a, nb, y)) != ref;
    }
    if (n0) atomicAdd(&bad[0], n0);
    if (n1) atomicAdd(&bad[1], n1);
}
"""
    fn = cp.RawModule(code=src, options=("-std=c++17",)).get_function("check")
    bad = cp.zeros(2, dtype=cp.uint32)
    fn(((1 << 23) // 256,), (256,), (np.int32(bits), bad))
    bad = bad.get().tolist()
    assert bad[0] > 0   # the product alone is not exact
    assert bad[1] == 0  # one correction is


def _smooth_rows(rng, rows: int, smooth: np.ndarray, dtype: str) -> np.ndarray:
    """x = xs * smooth for rows xs of every kind the SmoothQuant kernel tells apart,
    cycling: ordinary, all zero, all tiny (amax below 2**-20), huge (above 2**99), ordinary
    with tiny elements and zeros beside them, an inf, a NaN, and amax next to either end
    of the fast path."""
    k = smooth.size
    xs = rng.standard_normal((rows, k))
    for r in range(rows):
        kind = r % 9
        if kind == 1:
            xs[r] = 0
        elif kind == 2:
            xs[r] *= 2.0 ** rng.integers(-120, -24)
        elif kind == 3:
            xs[r] *= 2.0 ** rng.integers(100, 120)
        elif kind == 4:
            xs[r, ::3] *= 2.0 ** -110
            xs[r, 1::7] = 0
        elif kind == 5:
            xs[r, rng.integers(k)] = np.inf
        elif kind == 6:
            xs[r, rng.integers(k)] = np.nan
        elif kind in (7, 8):
            top = 2.0 ** (-20 if kind == 7 else 99)
            xs[r] *= top / np.max(np.abs(xs[r])) * (1 + rng.integers(-3, 4) * 2.0 ** -23)
    with np.errstate(invalid="ignore", over="ignore"):
        return (xs * smooth.astype(np.float64)).astype(FLOATS[dtype].numpy)


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_smooth_quant_rows(dtype, wide, rng, built_kernels):
    """Every kind of row (_smooth_rows) in one launch, blocks of one and of many rows, with
    factors in the fast path's range and with one outside it (0, inf, NaN, subnormal,
    2**-33, 2**33), against the NumPy backend; wide and narrow geometries."""
    from cuquant._cuda import symmetric as _symmetric

    policy = SMOOTH_ROWS if wide else SMOOTH_ROWS.replace(smooth_wide_min_elements=1 << 62)
    nvec_7168 = 7168 * np.dtype(FLOATS[dtype].numpy).itemsize // 16
    assert _symmetric.smooth_geometry(nvec_7168, True) != _symmetric.smooth_geometry(nvec_7168, False)
    for k in (40, 1000, 7168):
        del built_kernels[:]
        inside = rng.uniform(0.5, 2, k) * 2.0 ** rng.integers(-4, 5, k) * rng.choice([-1, 1], k)
        inside[:2] = (2.0 ** -32, -(2.0 ** 32))
        outside = inside.copy()
        outside[rng.integers(2, k)] = rng.choice([0, np.inf, np.nan, 1e-40, 2.0 ** -33, 2.0 ** 33])
        for smooth in (inside.astype(np.float32), outside.astype(np.float32)):
            x = _smooth_rows(rng, 90, np.where(np.isfinite(smooth) & (smooth != 0), smooth, 1),
                             dtype)
            host, dev = _run_both(SimpleNamespace(fn=cq.smooth_quant), (x, smooth),
                                  {"policy": policy})
            _compare(None, host, dev, f"smooth_quant K={k} {dtype}")
        nvec = k * np.dtype(FLOATS[dtype].numpy).itemsize // 16
        picked = [geom for geom, _ in smooth_kernels(built_kernels)]
        assert set(picked) == {_symmetric.smooth_geometry(nvec, wide)}, (k, picked)


def test_smooth_quant_quotients(rng):
    """One nonzero element a row, so its quotient x / smooth is the row's amax, which the
    scale shows: quotients log-uniform over [2**-30, 2**110] (both ends of the fast path
    and past them), factors over [2**-32, 2**32], float32 dividends of full precision."""
    rows, k = 20000, 64
    smooth = (rng.uniform(1, 2, k) * 2.0 ** rng.integers(-32, 33, k)
              * rng.choice([-1.0, 1.0], k)).astype(np.float32)
    col = rng.integers(0, k, rows)
    quot = 2.0 ** rng.uniform(-30, 110, rows) * rng.choice([-1.0, 1.0], rows)
    x = np.zeros((rows, k), np.float32)
    x[np.arange(rows), col] = (quot * smooth[col].astype(np.float64)).astype(np.float32)
    host, dev = _run_both(SimpleNamespace(fn=cq.smooth_quant), (x, smooth),
                          {"policy": SMOOTH_ROWS})
    _compare(None, host, dev, "smooth_quant one element a row")


@pytest.mark.parametrize("k", [7168, 7160])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_smooth_quant_near_half_integers(dtype, k, built_kernels):
    """Quotients x / smooth / scale on half-integers and next to them, which the rows
    kernel's codes from x / smooth * RN(1 / scale) cannot settle and divide again: whole
    rows of them, rows with one of them among ordinary quotients, in full rows (FULL) and
    not (K = 7160), against the NumPy backend."""
    g = np.random.default_rng(7)
    rows = 600
    halves = np.arange(k) % 255 - 127 + 0.5  # -126.5 ... 127.5, amax 127 below
    halves[0] = 127.0
    x = np.tile(halves, (rows, 1))
    x[1::2] = g.standard_normal((rows // 2, k)) * 20  # ordinary rows ...
    x[1::2, 0] = 127.0
    x[1::2, 5] = 63.5  # ... with one half-integer quotient each
    x *= g.choice([1.0, 0.5, 2.0, 0.25, 3.0, 2.0 ** -10], size=(rows, 1))
    smooth = np.ones(k)
    smooth[1::3], smooth[2::7] = 2.0, 0.5
    x *= smooth
    smooth[5::11] = 1 + 2.0 ** -23  # quotients one ulp off the half-integers
    x = x.astype(FLOATS[dtype].numpy)
    host, dev = _run_both(SimpleNamespace(fn=cq.smooth_quant), (x, smooth.astype(np.float32)),
                          {"policy": SMOOTH_ROWS})
    _compare(None, host, dev, f"smooth_quant near half-integers {dtype} K={k}")
    picked = [full for _, full in smooth_kernels(built_kernels)]
    assert picked == [k == 7168]  # FULL where rows fill the team's vectors


@pytest.mark.parametrize("k", [7168, 7160])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_smooth_quant_close_maxima(dtype, k):
    """Rows whose largest quotients x / smooth lie within 3 ulps of one value, in about five
    of 512 columns spread over the row (so over a team's threads and warps), a different
    five in each row. One product x * RN(1 / smooth) a column does not order them as the
    exact quotients do: in about 15% of the rows the largest product is not the
    largest quotient, and in about 1% the exact quotient of the largest product is not
    either, so the scale shows whether the kernel found the exact maximum."""
    g = np.random.default_rng(11)
    rows = 4096
    t = FLOATS[dtype].numpy
    cols = g.choice(k, 512, replace=False)
    near = (g.uniform(1, 2, 512) * g.choice([-1.0, 1.0], 512)).astype(t)  # x in those columns
    target = np.float32(g.uniform(1, 2))
    smooth = g.uniform(0.5, 4.0, k).astype(np.float32)
    smooth[cols] = (np.abs(near.astype(np.float64) / target).astype(np.float32).view(np.uint32)
                    + g.integers(0, 4, 512).astype(np.uint32)).view(np.float32)
    x = g.uniform(-0.4, 0.4, (rows, k)) * smooth  # quotients below 0.4
    x[:, cols] = np.where(g.random((rows, 512)) < 0.01, near.astype(np.float64), near * 0.5)
    x *= 2.0 ** g.integers(-8, 9, (rows, 1))
    host, dev = _run_both(SimpleNamespace(fn=cq.smooth_quant), (x.astype(t), smooth),
                          {"policy": SMOOTH_ROWS})
    _compare(None, host, dev, f"smooth_quant close maxima {dtype} K={k}")


def _workspace_words(cp, address):
    """The four uint32 words of a stream's workspace, copied to the host (after a sync)."""
    cp.cuda.Device().synchronize()
    mem = cp.cuda.UnownedMemory(address, 16, None)
    return cp.ndarray(4, np.uint32, cp.cuda.MemoryPointer(mem, 0)).get()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_smooth_quant_rows_from_the_counter(dtype, rng, built_kernels):
    """Full rows of 7 vectors a thread take their rows after the first two from a counter in
    the stream's workspace: one row, rows below and just past two rows a team (1056 for an
    H200's 528 teams, the rows dealt before the counter's first), every kind of row (some divide again, so teams run at different paces),
    two streams at once, each call against the NumPy backend; every workspace zeroed after."""
    import cupy as cp
    from cuquant._cuda import launch as _gpu
    k = 7168
    smooth = (rng.uniform(0.5, 2, k) * rng.choice([-1, 1], k)).astype(np.float32)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    for rows in (1, 1000, 1057, 2500):
        xs = [_smooth_rows(rng, rows, smooth, dtype) for _ in streams]
        want = [cq.smooth_quant(x, smooth, policy=SMOOTH_ROWS) for x in xs]
        ins = [(cp.asarray(x), cp.asarray(smooth)) for x in xs]
        cp.cuda.get_current_stream().synchronize()
        got = [cq.smooth_quant(*a, stream=s, policy=SMOOTH_ROWS)  # both in flight
               for a, s in zip(ins, streams)]
        for s in streams:
            s.synchronize()
        for h, d in zip(want, got):
            _compare(None, h, d, f"smooth_quant {dtype} {rows} x {k}")
        dev = cp.cuda.Device().id
        for s in streams + [cp.cuda.get_current_stream()]:
            words = _workspace_words(cp, _gpu.workspace(dev, s))
            assert not words.any(), f"workspace left set after {rows} rows: {words}"
    picked = smooth_kernels(built_kernels)
    assert set(picked) == {((128, 7), True)}, picked  # the geometry that takes rows from the counter


# ---------------------------------------------------------------------------------------
# Layouts, families, streams

VIEWS = {"transposed": lambda a: a.T, "column slice": lambda a: a[:, 7:300],
         "row stride": lambda a: a[::2], "column stride": lambda a: a[:, ::2]}


@pytest.mark.parametrize("view", list(VIEWS))
def test_non_contiguous_inputs(view, rng):
    import cupy as cp

    base = (rng.standard_normal((300, 512)) * 4).astype(np.float16)
    pick = VIEWS[view]
    for fn in (cq.quantize_int8_per_channel, cq.quantize_fp8_per_block,
               cq.quantize_fp8_per_token_group, cq.quantize_int8_per_tensor, cq.quantize_fp8_per_row):
        _compare(None, fn(pick(base)), fn(pick(cp.asarray(base))), f"{fn.__name__} {view}")


def test_column_layout_padding_on_device():
    import cupy as cp

    x = cp.asarray(np.ones((5, 256), np.float32))
    q, s = cq.quantize_fp8_per_token_group(x, scale_layout="column")
    assert s.shape == (5, 2) and s.strides == (4, 32)
    buf = cp.ndarray((2, 8), dtype=cp.float32, memptr=s.data)
    assert np.all(buf.get()[:, 5:] == 0)


def test_torch_in_torch_out(rng):
    torch = pytest.importorskip("torch")
    import cupy as cp

    x = torch.randn(257, 1000, device="cuda", dtype=torch.bfloat16) * 3
    for fn in (cq.quantize_int8_per_channel, cq.quantize_fp8_per_row, cq.quantize_fp8_per_block,
               cq.quantize_fp8_per_token_group, cq.quantize_int8_per_tensor):
        q, s = fn(x)
        assert isinstance(q, torch.Tensor) and q.is_cuda and q.device == x.device
        want = fn(cp.asarray(x.view(torch.int16)).view(ml_dtypes.bfloat16))
        assert_same_bits(q, want[0], fn.__name__)
        assert_same_bits(s, want[1], fn.__name__)
        if fn in (cq.quantize_fp8_per_row, cq.quantize_fp8_per_block, cq.quantize_fp8_per_token_group):
            assert q.dtype == torch.float8_e4m3fn
    q, s = cq.quantize_fp8_per_block(x)
    back = cq.dequantize_fp8_per_block(q, s, torch.bfloat16)
    assert back.dtype == torch.bfloat16 and back.shape == x.shape
    cpu = cq.quantize_int8_per_channel(x.cpu())
    assert not cpu[0].is_cuda
    assert_same_bits(cpu[0], cq.quantize_int8_per_channel(x)[0])


def test_torch_side_stream_handshake():
    """A tensor still being written on a torch side stream is safe to hand over inside
    that stream's context (DLPack's stream handshake orders the read after the write)."""
    torch = pytest.importorskip("torch")

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(4096, 4096, device="cuda", dtype=torch.float16)
        for _ in range(50):  # keep the side stream busy
            x.add_(1)
        q, s = cq.quantize_int8_per_tensor(x)
    torch.cuda.synchronize()
    assert float(s.item()) == np.float32(50) * (np.float32(1) / np.float32(127))
    assert bool((q == 127).all())


def test_jax_in_jax_out():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
    if not gpus:
        pytest.skip("JAX sees no GPU")
    x = jax.device_put(jnp.asarray(np.random.default_rng(1).standard_normal((129, 512)),
                                   dtype=jnp.bfloat16), gpus[0])
    q, s = cq.quantize_fp8_per_token_group(x)
    assert isinstance(q, jax.Array) and q.dtype == jnp.float8_e4m3fn
    host = cq.quantize_fp8_per_token_group(np.asarray(x))
    assert_same_bits(q, host[0])
    assert_same_bits(s, host[1])
    back = cq.dequantize_fp8_per_token_group(q, s, jnp.float32)
    assert back.dtype == jnp.float32 and isinstance(back, jax.Array)
    assert_same_bits(back, cq.dequantize_fp8_per_token_group(*host, np.float32))


def test_stream_argument():
    import cupy as cp

    x = cp.asarray(np.random.default_rng(2).standard_normal((64, 4096)).astype(np.float16))
    want = cq.quantize_int8_per_channel(x)
    s = cp.cuda.Stream(non_blocking=True)
    got = cq.quantize_int8_per_channel(x, stream=s)
    s.synchronize()
    _compare(None, want, got, "cupy stream")
    got = cq.quantize_int8_per_channel(x, stream=s.ptr)
    s.synchronize()
    _compare(None, want, got, "raw stream handle")
    with s:
        got = cq.quantize_int8_per_tensor(x)  # the current stream, twice in a row
        got2 = cq.quantize_int8_per_tensor(x)
    s.synchronize()
    _compare(None, got, got2, "per-tensor workspace reuse")


# ---------------------------------------------------------------------------------------
# Replays (cuquant/_core/replay.py): repeated calls on CuPy arrays skip straight to the launch

def _replay_cases():
    for op in OPS:
        if op.name == "dequantize_groupwise_batched":
            continue
        # the first variants, and the first seeded and the first given words, whichever
        # those are
        firsts = list(op.variants[:4])
        for source in ("seed", "rbits"):
            firsts += [v for v in op.variants if v.get("source") == source][:1]
        for i, variant in enumerate(firsts):
            if variant not in firsts[:i]:
                yield pytest.param(op, variant, id=f"{op.name}-{variant}")


@pytest.mark.parametrize("op,variant", list(_replay_cases()))
def test_replays_match_numpy(op, variant, rng):
    """Three calls with the same key on fresh data (and a fresh seed, for a seeded variant:
    the replay's run-time value): the second and third run the first call's replay
    (checked in the table) on the current stream, a side stream made current for the
    third, and still give the NumPy backend's bits. Calls that cannot be kept (a strided
    array) go the whole way each time."""
    import cupy as cp

    from cuquant._core import arrays as _arrays

    from cuquant._core import replay as _fast

    _arrays.cupy_module()  # CuPy known to cuquant: calls on its arrays can be kept
    _fast.clear()
    side = cp.cuda.Stream(non_blocking=True)
    for call in range(3):
        args, kwargs = op.make(np, rng, (16, 4096), op.dtypes[0], **variant)
        if call < 2:
            host, dev = _run_both(op, args, kwargs)
        else:
            with side:
                host, dev = _run_both(op, args, kwargs)
            side.synchronize()
        _compare(op, host, dev, f"{op.name} call {call}")
        kept = all(a.flags.c_contiguous for a in list(args) + list(kwargs.values())
                   if isinstance(a, np.ndarray))
        assert bool(_fast._table) == kept


def test_replay_after_refusals():
    """A kept replay does not let through what the checks refuse: a bool or float group
    size, another dtype, a misaligned or non-contiguous view, a scale of another shape."""
    import cupy as cp

    from _util import assert_refused

    x = cp.asarray(np.random.default_rng(5).standard_normal((16, 4096)).astype(np.float16))
    for _ in range(2):
        cq.quantize_fp8_per_token_group(x, 128)
        cq.quantize_int8_per_block(x, block_size=128)
    assert_refused(cq.quantize_fp8_per_token_group, (x, 128.0), {}, TypeError, ["group_size"])
    assert_refused(cq.quantize_int8_per_block, (x,), {"block_size": True}, TypeError,
                   ["block_size"])
    assert_refused(cq.quantize_fp8_per_token_group, (x.astype(cp.int32), 128), {}, TypeError,
                   ["x"])
    q, s = cq.quantize_int8_per_channel(x)
    for _ in range(2):
        cq.dequantize_int8_per_channel(q, s, "float16")
    assert_refused(cq.dequantize_int8_per_channel, (q, s[:8], "float16"), {}, ValueError,
                   ["scale"])
    shifted = cp.empty(16 * 4096 + 1, cp.float16)[1:].reshape(16, 4096)  # 2 bytes off
    shifted[...] = x
    _compare(None, cq.quantize_fp8_per_token_group(x.get(), 128),
             cq.quantize_fp8_per_token_group(shifted, 128), "misaligned after aligned")
    wide = cp.zeros((16, 8192), cp.float16)
    wide[:, ::2] = x
    _compare(None, cq.quantize_fp8_per_token_group(x.get(), 128),
             cq.quantize_fp8_per_token_group(wide[:, ::2], 128), "strided after contiguous")


def test_static_device_scale():
    import cupy as cp

    x = cp.asarray(np.random.default_rng(3).standard_normal((33, 100)).astype(np.float32))
    scale = cp.asarray([0.05], dtype=cp.float32)
    q, s = cq.quantize_fp8_per_tensor(x, scale=scale)
    qh, sh = cq.quantize_fp8_per_tensor(x.get(), scale=0.05)
    _compare(None, (q, s), (qh, sh), "device scale")


# ---------------------------------------------------------------------------------------
# Scales that round down: amax * f32(1/qmax) in the subnormals is rounded by up to half its
# size, so quotients pass qmax (an amax of 190 units of 2**-149 gives an int8 scale of one
# unit and a quotient of 190, which must clamp to 127).

_SMALLEST = {"float32": 2.0 ** -149, "bfloat16": 2.0 ** -133, "float16": 2.0 ** -24}


def rounded_down_amaxes() -> list[int]:
    """Amaxes in units of the smallest subnormal: 190 and 671 (int8's and fp8's scales of
    one unit, rounded down by a third), and for each power of two 2**j the largest amax
    whose scale rounds to 2**j - 1 units (just below the power), and one unit less."""
    out = {190, 191, 671, 672}
    for j in range(1, 24):
        for qmax in (127, 448):
            a = int(np.floor((2 ** j - 0.5) * qmax))
            out.update((a, a - 1))
    return sorted(out)


def _tiny_rows(shape, dtype, amaxes, rng) -> np.ndarray:
    """x of `shape` (rows along the last axis) whose row r holds integers in [-A, A] units
    of the dtype's smallest subnormal, A = amaxes[r % len], with +-A at every 32nd element
    (so every group, block and tile of the row has that amax)."""
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    k = shape[-1]
    a = np.array([amaxes[r % len(amaxes)] for r in range(rows)], np.float64)[:, None]
    x = np.floor(rng.uniform(-1, 1, size=(rows, k)) * (a + 1))
    x = np.clip(x, -a, a)
    x[:, ::32] = a * rng.choice([-1.0, 1.0], size=x[:, ::32].shape)
    x = (x * _SMALLEST[dtype]).astype(np.float32)  # float32 first: exact up to 2**24 units
    return x.astype(FLOATS[dtype].numpy).reshape(shape)


def _shape_with_most_rows(op, dtype, variant, rng):
    """The op's test shape with the most rows that its variant takes (a group size must
    divide K)."""
    shapes = sorted((s for s in op.shapes if len(s) >= 2 and 0 < int(np.prod(s)) <= 1 << 21),
                    key=lambda s: (int(np.prod(s[:-1])), int(np.prod(s))), reverse=True)
    for shape in shapes:
        args, kwargs = op.make(np, rng, shape, dtype, **variant)
        try:
            op.fn(*args, **kwargs)
        except ValueError:
            continue
        return args[0].shape  # the op's maker may fit K to the group size
    raise AssertionError(f"{op.name} {variant}: no test shape takes this variant")


ROUNDING_DTYPES = ("float32", "bfloat16", "float16")


@pytest.mark.parametrize("op", QUANTIZERS, ids=[_name(o) for o in QUANTIZERS])
def test_scales_that_round_down(op, rng):
    """Every quantizer, every variant, in every dtype it takes: rows whose scales land in
    the subnormals and round down (float32 reaches the int8 and fp8 cases of a few units;
    bfloat16 and float16 the smallest amaxes they hold), against the NumPy backend."""
    amaxes = rounded_down_amaxes()
    per_tensor = "per_tensor" in op.name
    for dtype in (d for d in ROUNDING_DTYPES if d in op.dtypes):
        for variant in op.variants:
            shape = (8, 256) if per_tensor else _shape_with_most_rows(op, dtype, variant, rng)
            rows = int(np.prod(shape[:-1]))
            # per tensor: one amax a call; otherwise one a row, as many calls as it takes
            runs = [[a] for a in amaxes] if per_tensor else [
                amaxes[i:i + rows] for i in range(0, len(amaxes), rows)]
            for run in runs:
                args, kwargs = op.make(np, rng, shape, dtype, **variant)
                args = (_tiny_rows(shape, dtype, run, rng),) + tuple(args[1:])
                host, dev = _run_both(op, args, kwargs)
                _compare(op, host, dev, f"{op.name} {dtype} {variant} amaxes {run[0]}..")


def test_subnormal_scale_codes_clamp_on_the_gpu():
    """The reported case: an amax of 190 units of 2**-149 at 64 x 1024, float32. The scale is
    one unit; 190 / 1 must give 127, not the wrapped -66."""
    x = np.zeros((64, 1024), np.float32)
    x[:, ::64] = np.float32(190 * 2.0 ** -149)
    x[:, 1::64] = -x[:, ::64]
    import cupy as cp

    for fn in (cq.quantize_int8_per_tensor, cq.quantize_int8_per_channel,
               cq.quantize_int8_per_block):
        q, s = fn(cp.asarray(x))
        assert int(s.view(cp.uint32).max().get()) == 1, fn.__name__
        q = q.get()
        assert (q[:, ::64] == 127).all() and (q[:, 1::64] == -127).all(), fn.__name__


# TileOPs' edge inputs for its quantize ops: all-zero rows and blocks, rounding ties,
# storage one element off a 16-byte boundary, K of 3, 264 and 999, a partial last block, a
# scale that underflows to zero, and 1497 x 4995 for the per-tensor kernel.

def _tileops_edges(op, dtype, shape, rng, variant):
    args, kwargs = op.make(np, rng, shape, dtype, **variant)
    x = args[0].astype(np.float32)
    m, k = x.shape
    x[0] = 0.0                                   # an all-zero row
    x[1, : min(k, 32)] = 0.0                     # an all-zero first block
    if m > 2:                                    # ties: amax 127 (scale 1), halves between
        x[2] = np.resize(np.arange(-63.5, 64.0, 0.5, dtype=np.float32), k)
        x[2, 0] = 127.0
    if m > 3:                                    # a scale that underflows to zero
        x[3] = 0.0
        x[3, 0] = np.float32(2.0 ** -149) if dtype == "float32" else 0.0
    return (x.astype(FLOATS[dtype].numpy),) + tuple(args[1:]), kwargs


TILEOPS_OPS = [op for op in SYMMETRIC_QUANTIZERS]


@pytest.mark.parametrize("op", TILEOPS_OPS, ids=[_name(o) for o in TILEOPS_OPS])
def test_tileops_edge_inputs(op, rng):
    shapes = [(5, 3), (9, 264), (17, 999), (33, 4096 + 77)]
    if "per_tensor" in op.name:
        shapes.append((1497, 4995))
    for dtype in op.dtypes:
        for variant in op.variants:
            for shape in shapes:
                args, kwargs = _tileops_edges(op, dtype, shape, rng, variant)
                host, dev = _run_both(op, args, kwargs)
                _compare(op, host, dev, f"{op.name} {dtype} {shape} {variant}")
                # The same input starting one element off a 16-byte boundary.
                import cupy as cp

                x = args[0]
                buf = cp.empty(x.size + 1, dtype=x.dtype)
                off = buf[1:].reshape(x.shape)
                off[...] = cp.asarray(x)
                rest = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args[1:]]
                _compare(op, host, op.fn(off, *rest, **kwargs),
                         f"{op.name} {dtype} {shape} {variant} unaligned")


# ---------------------------------------------------------------------------------------
# Above 2**31 elements (64-bit offsets)

def test_above_2_31_elements(rng):
    import cupy as cp

    rows, k = (1 << 31) // 4096 + 16, 4096
    g = cp.random.default_rng(int(rng.integers(1 << 31)))
    x = g.standard_normal((rows, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    boundary = (1 << 31) // k
    check = np.r_[0:2, boundary - 2:boundary + 2, rows - 2:rows]
    xh = x[check].get()

    q, s = cq.quantize_int8_per_channel(x)
    qh, sh = cq.quantize_int8_per_channel(xh)
    assert_same_bits(q[check], qh, "int8 per channel")
    assert_same_bits(s[check], sh, "int8 per channel scale")
    back = cq.dequantize_int8_per_channel(q, s, ml_dtypes.bfloat16)
    assert_same_bits(back[check], cq.dequantize_int8_per_channel(qh, sh, ml_dtypes.bfloat16))
    del q, back

    q, s = cq.quantize_fp8_per_token_group(x, scale_layout="column")
    qh, sh = cq.quantize_fp8_per_token_group(xh)
    assert_same_bits(q[check], qh, "fp8 token group")
    assert_same_bits(s[check], sh, "fp8 token group scale")
    del q, s

    q, s = cq.quantize_fp8_per_tensor(x)
    amax = float(cp.abs(x.astype(cp.float32)).max())
    sh = np.float32(amax) * E4M3.inv_qmax
    assert_same_bits(s, np.array([sh], np.float32), "fp8 per tensor scale")
    assert_same_bits(q[check], cq.quantize_fp8_per_tensor(xh, scale=float(sh))[0], "fp8 per tensor")
