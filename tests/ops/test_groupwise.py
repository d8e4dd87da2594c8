"""Group-wise integer quantization in DeepSpeed's format on the NumPy backend
(docs/formats.md section 5): golden cases by hand, properties, batched dequantization, the
specialization table, empty inputs and refusals."""

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cuquant as cq
from _util import assert_refused, assert_same_bits
from cuquant._cuda import groups as gw
from cuquant._cuda import groupwise as ds
from cuquant._numpy import groupwise as _numpy_groupwise
from cuquant._numpy.groupwise import group_multipliers
from cuquant._core.dtypes import FLOATS

BF16 = ml_dtypes.bfloat16
F32 = np.float32


def codes_of(q, bits):
    """The signed codes of quantize_groupwise output, unpacked."""
    return _numpy_groupwise._codes(q, bits)


def nibbles(q):
    """Packed DeepSpeed bytes as (high, low) signed nibble pairs."""
    b = np.asarray(q).view(np.uint8).reshape(-1)
    hi = ((b >> 4) ^ 8).astype(np.int8) - 8
    lo = ((b & 15) ^ 8).astype(np.int8) - 8
    return list(zip(hi.tolist(), lo.tolist()))


# ---------------------------------------------------------------------------------------
# Golden cases

def test_symmetric_4bit_packing_first_element_high():
    # m = 8: mult = 16 / 16 = 1, params [1]; 8 clamps to 7, -8 stays, 4.5 is a tie -> 4.
    x = np.array([8.0, -8.0, 4.5, 0.0, -1.0, 3.0], dtype=np.float32)
    q, p = cq.quantize_groupwise(x, 4, True, 6)
    assert q.dtype == np.int8 and q.shape == (3,)
    assert q.view(np.uint8).tolist() == [0x78, 0x40, 0xF3]
    assert nibbles(q) == [(7, -8), (4, 0), (-1, 3)]
    assert p.tolist() == [[1.0]]
    back = cq.dequantize_groupwise(q, p, 4, True, 6, np.float32)
    assert back.tolist() == [7.0, -8.0, 4.0, 0.0, -1.0, 3.0]


def test_asymmetric_4bit_offsets_and_ties():
    # lo = 0, hi = 16: mult = 16 / 16 = 1, offset 8; x - 8 = -8, 8 -> 7, .5 -> 0 (tie),
    # 1.5 -> 2, 2.5 -> 2 (ties to even).
    x = np.array([[0.0, 16.0, 8.5, 9.5, 10.5, 8.0]], dtype=np.float32)
    q, p = cq.quantize_groupwise(x, 4, False, 6)
    assert q.shape == (1, 3)
    assert nibbles(q) == [(-8, 7), (0, 2), (2, 0)]
    assert p.tolist() == [[1.0, 8.0]]
    back = cq.dequantize_groupwise(q, p, 4, False, 6, np.float32)
    assert back.tolist() == [[0.0, 15.0, 8.0, 10.0, 10.0, 8.0]]


def test_8bit_symmetric_ties_and_clamp():
    # m = 64: mult = 256 / 128 = 2; x * 2 = .5 -> 0, 1.5 -> 2, 2.5 -> 2, -.5 -> 0, 128 -> 127.
    x = np.array([0.25, 0.75, 1.25, -0.25, 64.0, -64.0, 10.0, 0.0], dtype=np.float16)
    q, p = cq.quantize_groupwise(x, 8, True, 8)
    assert q.tolist() == [0, 2, 2, 0, 127, -128, 20, 0]
    assert p.tolist() == [[0.5]]


def test_mult_and_params_are_true_divisions():
    # A symmetric 8-bit group with m = 3: mult = f32(256) / f32(6) (IEEE), params f32(1 / mult).
    x = np.array([3.0, -1.0, 0.7, 2.2], dtype=np.float32)
    q, p = cq.quantize_groupwise(x, 8, True, 4)
    mult = F32(256) / F32(6)
    assert_same_bits(p, np.array([[F32(1) / mult]], np.float32))
    want = np.clip(np.rint(x * mult), -128, 127).astype(np.int8)
    assert q.tolist() == want.tolist() == [127, -43, 30, 94]
    # asymmetric: mult = 256 / (hi - lo), offset = (hi + lo) * 0.5 (two roundings)
    q, p = cq.quantize_groupwise(x, 8, False, 4)
    hi, lo = F32(3.0), F32(-1.0)
    mult, off = F32(256) / (hi - lo), (hi + lo) * F32(0.5)
    assert_same_bits(p, np.array([[F32(1) / mult, off]], np.float32))
    assert q.tolist() == np.clip(np.rint((x - off) * mult), -128, 127).astype(int).tolist()


def test_constant_and_zero_groups():
    x = np.array([3.5] * 4 + [0.0] * 4 + [-0.0] * 4 + [0.0, -0.0, -0.0, 0.0], dtype=np.float32)
    q, p = cq.quantize_groupwise(x, 8, False, 4)
    # hi == lo: mult 1, offset = the value; codes 0. The all -0 group keeps a -0 offset;
    # a mix of zeros has max +0 and min -0, offset +0 (-0 < +0 for the group max and min).
    assert q.tolist() == [0] * 16
    assert p[:, 0].tolist() == [1.0] * 4
    assert p.view(np.uint32)[:, 1].tolist() == [0x40600000, 0, 0x80000000, 0]
    q, p = cq.quantize_groupwise(x, 4, True, 4)
    # symmetric constant 3.5: mult = 16 / 7; 3.5 * mult = 8.0000004 -> 8 -> clamped to 7
    mult = F32(16) / F32(7)
    assert nibbles(q)[:2] == [(7, 7), (7, 7)]
    assert_same_bits(p, np.array([[F32(1) / mult], [1.0], [1.0], [1.0]], np.float32))


def test_nan_and_inf_groups():
    x = np.array([1.0, np.nan, 2.0, 3.0,          # NaN: every code 0, NaN params
                  1.0, np.inf, -2.0, 0.0,         # inf: mult 0 (sym) or 0 (asym)
                  -np.inf, -np.inf, -np.inf, -np.inf], dtype=np.float32)
    q, p = cq.quantize_groupwise(x, 8, True, 4)
    assert q.tolist() == [0] * 12
    assert p.view(np.uint32)[0, 0] == 0x7FFFFFFF and p[1, 0] == np.inf and p[2, 0] == np.inf
    q, p = cq.quantize_groupwise(x, 8, False, 4)
    # second group: hi - lo = inf, mult = 0, offset inf: (x - inf) * 0 = NaN -> 0
    # third group: hi == lo = -inf, mult 1, offset -inf: -inf - -inf = NaN -> 0
    assert q.tolist() == [0] * 12
    assert p.view(np.uint32)[0].tolist() == [0x7FFFFFFF, 0x7FFFFFFF]
    assert p[1].tolist() == [np.inf, np.inf] and p[2].tolist() == [1.0, -np.inf]
    back = cq.dequantize_groupwise(q, p, 8, False, 4, np.float16)
    assert back.view(np.uint16)[:4].tolist() == [0x7FFF] * 4  # canonical NaN


def test_subnormal_inputs_and_params_are_honoured():
    # m = 2**-124: mult = 16 / 2**-123 = 2**127, params 2**-127 (subnormal). The subnormal
    # inputs 2**-127 and 3 * 2**-128 give codes 1 and 2 (1.5 -> 2); flushing gives 0.
    t = F32(2.0 ** -128)
    x = np.array([16 * t, 2 * t, 3 * t, -t], dtype=np.float32)
    q, p = cq.quantize_groupwise(x, 4, True, 4)
    assert nibbles(q) == [(7, 1), (2, 0)]   # 16t * 2**127 = 8 -> 7; -t -> -0.5 -> 0
    assert p.view(np.uint32).tolist() == [[0x00400000]]   # 2**-127
    back = cq.dequantize_groupwise(q, p, 4, True, 4, np.float32)
    assert back.tolist() == [7 * 2 * t, 2 * t, 4 * t, 0.0]


def test_bfloat16_is_read_as_bfloat16():
    x = np.array([1e30, -1e30, 5e29, 0.0], dtype=BF16)
    q, p = cq.quantize_groupwise(x, 8, True, 4)
    m = x.astype(np.float32)[0]
    mult = F32(256) / (m * F32(2))
    assert q.tolist() == [127, -128, int(np.rint(x.astype(np.float32)[2] * mult)), 0]
    assert_same_bits(p, np.array([[F32(1) / mult]], np.float32))


def test_groups_run_over_the_flattened_tensor():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10
    q, p = cq.quantize_groupwise(x, 8, False, 6)
    q2, p2 = cq.quantize_groupwise(x.reshape(-1), 8, False, 6)
    assert q.shape == x.shape and p.shape == (4, 2)
    assert_same_bits(q.reshape(-1), q2)
    assert_same_bits(p, p2)
    # 4 bits: pairs of the flattened tensor, packed along the last axis
    q4, _ = cq.quantize_groupwise(x, 4, True, 3)   # odd groups: a byte spans two groups
    assert q4.shape == (2, 3, 2)
    flat, _ = cq.quantize_groupwise(x.reshape(-1), 4, True, 3)
    assert_same_bits(q4.reshape(-1), flat)


@pytest.mark.parametrize("g", [1, 6, 24, 136, 20000, 65536])
def test_any_group_size_is_each_group_alone(g, rng):
    n = g * 3 if g > 136 else 2 * 3 * 136 * 2
    x = (rng.standard_normal(n) * 3).astype(np.float16)
    for bits, sym in itertools.product((4, 8), (False, True)):
        q, p = cq.quantize_groupwise(x, bits, sym, g)
        assert p.shape == (n // g, 1 if sym else 2)
        span = 2 if bits == 4 and g % 2 else 1   # a 4-bit slice needs an even length
        codes = codes_of(q, bits).reshape(-1)
        for i in (0, n // g - span):
            part = slice(i * g, (i + span) * g)
            qi, pi = cq.quantize_groupwise(x[part], bits, sym, g)
            assert_same_bits(p[i:i + span], pi)
            assert_same_bits(codes[part], codes_of(qi, bits))


def test_dequantize_rounds_twice_without_fma():
    # asymmetric: dtype(f32(f32(q) * p0) + p1), never fused
    q = np.array([3, -7], dtype=np.int8)
    p = np.array([[0.1, 1e8]], dtype=np.float32)
    out = cq.dequantize_groupwise(q, p, 8, False, 2, np.float32)
    want = ((q.astype(np.float32) * p[0, 0]).astype(np.float32) + p[0, 1]).astype(np.float32)
    assert_same_bits(out, want)
    out = cq.dequantize_groupwise(q, p[:, :1], 8, True, 2, BF16)
    assert out.dtype == BF16
    assert_same_bits(out, (q.astype(np.float32) * p[0, 0]).astype(np.float32).astype(BF16))


def test_int4_per_group_is_asymmetric_groups_along_k(rng):
    w = (rng.standard_normal((5, 256)) * 2).astype(np.float16)
    packed, params = cq.quantize_int4_per_group(w)
    assert packed.shape == (5, 128) and packed.dtype == np.int8 and params.shape == (10, 2)
    q, p = cq.quantize_groupwise(w, 4, False, 128)
    assert_same_bits(packed, q)
    assert_same_bits(params, p)
    back = cq.dequantize_int4_per_group(packed, params, np.float16)
    assert_same_bits(back, cq.dequantize_groupwise(q, p, 4, False, 128, np.float16))
    packed, params = cq.quantize_int4_per_group(w, group_size=32)
    assert params.shape == (40, 2)


# ---------------------------------------------------------------------------------------
# Properties

finite = st.floats(-3e4, 3e4, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=80, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=24), elements=finite),
       st.sampled_from([4, 8]), st.booleans(), st.data())
def test_round_trip_error_is_half_a_step(x, bits, sym, data):
    if bits == 4 and x.shape[-1] % 2:
        x = np.concatenate([x, x[..., :1]], axis=-1)
    n = x.size
    g = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    q, p = cq.quantize_groupwise(x, bits, sym, g)
    y = cq.dequantize_groupwise(q, p, bits, sym, g, np.float32).astype(np.float64).reshape(-1, g)
    codes = codes_of(q, bits).astype(np.int64).reshape(-1, g)
    step = p[:, :1].astype(np.float64)
    err = np.abs(y - x.astype(np.float64).reshape(-1, g))
    # half a step, and float32 rounding of x - offset, the product and the sum; the top
    # code is one step short of the range (2**(bits-1) clamps to 2**(bits-1) - 1)
    slack = step * 1e-5 + np.abs(x.reshape(-1, g)).max(axis=1, keepdims=True) * 2e-7 + 1e-30
    top = codes == (1 << (bits - 1)) - 1
    ok = step[:, 0] >= np.finfo(np.float32).tiny
    assert np.all((err <= np.where(top, 1.0, 0.5) * step + slack)[ok])
    assert np.all(codes >= -(1 << (bits - 1))) and np.all(codes < (1 << (bits - 1)))


normal = finite.filter(lambda v: v == 0 or abs(v) >= 1e-20)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 12).map(lambda k: (6 * k,)), elements=normal),
       st.sampled_from([4, 8]), st.booleans(), st.integers(-8, 8))
def test_power_of_two_scaling_keeps_codes(x, bits, sym, k):
    # Every operation commutes with an exact power-of-two scale: the same codes, params
    # scaled by 2**k (a constant group keeps the multiplier 1, so its first param stays 1).
    q, p = cq.quantize_groupwise(x, bits, sym, 6)
    qs, ps = cq.quantize_groupwise(x * F32(2.0 ** k), bits, sym, 6)
    assert_same_bits(qs, q)
    g = x.reshape(-1, 6)
    const = (g == 0).all(axis=1) if sym else (g.max(axis=1) == g.min(axis=1))
    want = p * F32(2.0 ** k)
    want[const, 0] = 1.0
    assert_same_bits(ps, want)


# ---------------------------------------------------------------------------------------
# Batched

def test_batched_equals_one_call_each(rng):
    items, wants = [], []
    for i, (shape, g) in enumerate([((4, 256), 128), ((3, 40), 24), ((6,), 1), ((5, 14), 7)]):
        for bits, sym in itertools.product((4, 8), (False, True)):
            x = (rng.standard_normal(shape) * (i + 1)).astype(np.float32)
            q, p = cq.quantize_groupwise(x, bits, sym, g)
            items.append((q, p, bits, sym, g) if len(items) % 2 else
                         {"q": q, "params": p, "bits": bits, "symmetric": sym, "group_size": g})
            wants.append(cq.dequantize_groupwise(q, p, bits, sym, g, BF16))
    got = cq.dequantize_groupwise_batched(items, BF16)
    assert isinstance(got, list) and len(got) == len(wants)
    for a, b in zip(got, wants):
        assert_same_bits(a, b)
    assert cq.dequantize_groupwise_batched([], np.float16) == []


# ---------------------------------------------------------------------------------------
# Every specialization a launcher can pick is enumerated (and so compile-checked)

def test_launchable_specializations_are_enumerated():
    from cuquant._cuda import zero_point

    listed = {e for _, e in itertools.chain(ds.specializations(), zero_point.specializations())}
    sizes = sorted({1, 2, 3, 5, 6, 7, 24, 100, 136, 513, 4000, 20000, 65536, 131072, 300000}
                   | {1 << i for i in range(18)} | {3 << i for i in range(16)})
    # The staged and tile kernels each plan can pick: (staged format, units a thread,
    # two-pass sizes, tile format), for DeepSpeed's under every STAGED setting the tests
    # use, for the zero point's by mode.
    ds_staged = [(ds._ds_format, hold, gw.TWO_PASS_UNITS, ds._ds_format) for hold in (2, 4, 8)]
    zp_staged = list(zero_point.KERNELS_BY_MODE.values())
    for t, bits, g in itertools.product(FLOATS.values(), gw.BITS, sizes):
        for fmt, big, types, staged_plans in (
                ("cq::DeepSpeed", True, FLOATS, ds_staged),
                ("cq::ZeroPoint", False, ("float16", "bfloat16"), zp_staged)):
            if t.name not in types:
                continue
            vec = t.vector_width
            if g % vec == 0:
                units = g // vec
                geom = gw.geometry(units, True, big)
                assert gw.quant_expr(f"{fmt}<{bits}>", t, vec, geom) in listed, (fmt, t, bits, g)
                for fmt_of_bits, hold, two_pass_units, tile_fmt_of_bits in staged_plans:
                    for two_pass in (True, False):   # tests switch two passes off
                        if units <= gw.STAGED_MAX_UNITS:
                            geom = (gw.two_pass_geometry(units)
                                    if two_pass and units in two_pass_units
                                    else gw.staged_geometry(units, hold))
                            expr = gw.quant_staged_expr(fmt_of_bits(bits), t, geom)
                            assert expr in listed, (expr, g, hold)
                    if units in cq.DEFAULT_POLICY.tile_units:
                        expr = gw.quant_tile_expr(tile_fmt_of_bits(bits), t,
                                                  gw.tile_geometry(units))
                        assert expr in listed, (expr, g)
            length = 2 * g if bits == 4 and g % 2 else g
            vec = gw.general_vec(bits)
            geom = gw.geometry(length // vec, False, big)
            assert gw.quant_expr(f"{fmt}<{bits}>", t, vec, geom) in listed, (fmt, t, bits, g)
            assert gw.quant_small_expr(f"{fmt}<{bits}>", t) in listed, (fmt, t, bits)
    for bits, out in itertools.product(gw.BITS, FLOATS.values()):
        # d: units of a group (fast path) or the group size (general path).
        for vec, d in itertools.product((out.vector_width, gw.general_vec(bits)), range(1, 40)):
            for sym in (False, True):
                expr, _ = gw.dequant_kernel(ds._ds_codes(bits, sym), out, vec, d, gw.DQ_UNROLL)
                assert expr in listed, expr
            for ts in ("float16", "bfloat16"):
                expr, _ = gw.dequant_kernel(zero_point._zp_codes(bits, FLOATS[ts]), out, vec, d,
                                            zero_point.DQ_UNROLL)
                assert expr in listed, expr
        for g in range(1, 40):
            for sym in (False, True):
                assert gw.dequant_spanning_expr(ds._ds_codes(bits, sym), out, g,
                                                gw.DQ_UNROLL) in listed, (g, sym)
            for ts in ("float16", "bfloat16"):
                assert gw.dequant_spanning_expr(zero_point._zp_codes(bits, FLOATS[ts]), out, g,
                                                zero_point.DQ_UNROLL) in listed, (g, ts)
        assert ds.batched_expr(out) in listed
    n_gw, n_zp = len(list(ds.specializations())), len(list(zero_point.specializations()))
    # No duplicates, and a bound that keeps the compile check's time in hand (805 now).
    assert len(listed) == n_gw + n_zp and n_gw + n_zp < 820


def test_tile_geometry():
    """A tile holds at most TILE_MAX_GROUPS groups (the kernel's shared-memory tables) and
    whole groups at every step of a warp (32 units); the table's units a lane otherwise."""
    for units in cq.DEFAULT_POLICY.tile_units:
        upg, k = gw.tile_geometry(units)
        assert upg == units and 32 % units == 0 and k >= 1
        assert 32 * k // units <= gw.TILE_MAX_GROUPS
        assert k == min(cq.DEFAULT_POLICY.tile_units_per_lane, gw.TILE_MAX_GROUPS * units // 32)
    assert gw.tile_geometry(16) == (16, 8) and gw.tile_geometry(2) == (2, 4)
    assert gw.tile_geometry(16, 16) == (16, 16) and gw.tile_geometry(4, 16) == (4, 8)


@pytest.fixture
def planned(monkeypatch):
    """Launch plans made without a GPU: the loader hands out a kernel's name expression and
    notes it, a device holds 264 blocks of any kernel at once (the device's stand-ins, not a
    choice of kernel). Yields the list of the name expressions the plans ask for."""
    from cuquant._cuda import kernels, launch

    class Kernel:
        def __init__(self, expr):
            self.expr = expr

    class Launch:
        def __init__(self, fn, nargs, smem=0):
            self.fn, self.smem = fn, smem

    built = []
    monkeypatch.setattr(kernels, "function",
                        lambda src, expr, device: (built.append(expr), Kernel(expr))[1])
    monkeypatch.setattr(launch, "resident_blocks", lambda *a, **k: 264)
    monkeypatch.setattr(launch, "Launch", Launch)
    launch.clear_plans()
    yield built
    launch.clear_plans()


def _plan(t, n, g, aligned, persistent=True, policy=cq.DEFAULT_POLICY):
    """The quantizer's plan for n elements of t in groups of g, with distinct formats for the
    general ("F"), staged ("S") and tile ("T") kernels."""
    return gw._problem_plan("groupwise.cu", "F", "S", "T", t, 8, n, g, aligned, True, 0,
                            gw.TWO_PASS_UNITS, persistent, 0, policy)


def test_tile_grid(planned):
    """The tile kernel's grid: the blocks resident at once where it is persistent (DeepSpeed's
    format), a block for each block's worth of tiles where not (the zero point), never more
    than the policy's tile_max_blocks when that is set."""
    fp16 = FLOATS["float16"]
    policy = cq.KernelPolicy(tiles=True)

    def grid(n, persistent, policy=policy):
        plan = _plan(fp16, n, 128, True, persistent, policy)
        assert planned[-1].startswith("cq::quantize_groups_tiles<T,"), planned
        return plan[1]

    # 8 warps a block, 8 units a lane, 16 units a group: 128 groups a block's tiles.
    n = 16384 * 7168  # 917504 groups
    assert grid(n, True) == 264 and grid(n, False) == 7168
    assert grid(128 * 128 * 3 + 128, True) == 4 and grid(128 * 128 * 3 + 128, False) == 4
    policy = policy.replace(tile_max_blocks=1)
    assert grid(n, True, policy) == 1 and grid(n, False, policy) == 1


@pytest.mark.parametrize("on", [False, True])
def test_tile_kernel_choice(on, planned):
    """Where the policy has the tile kernel on, the plan takes it for aligned inputs of at
    least one tile whose groups are 2-32 whole units, with the tile kernel's format;
    nowhere else."""
    policy = cq.KernelPolicy(tiles=on, staged=True)  # staged: as on a device with bulk copies
    fp16, fp32 = FLOATS["float16"], FLOATS["float32"]
    cases = [  # (type, n, g, aligned, the kernel where tiles are on)
        (fp16, 16384 * 7168, 128, True, "tiles"),
        (fp16, 256 * 8, 128, True, "tiles"),       # exactly one tile (8 units a lane)
        (fp16, 240 * 8, 128, True, "held"),        # less than a tile, under min_bytes
        (fp16, 16384 * 7168, 128, False, "held"),  # unaligned: the general path
        (fp16, 16384 * 7168, 2048, True, "staged"),  # 256 units a group
        (fp16, 16384 * 7168, 24, True, "staged"),    # 3 units a group
        (fp16, 16384 * 7168, 16, True, "tiles"),     # 2 units: 4 a lane, 128 a tile
        (fp16, 128 * 8, 16, True, "tiles"),          # one such tile
        (fp16, 120 * 8, 16, True, "held"),
        (fp32, 16384 * 7168, 128, True, "tiles"),    # 32 units
        (fp32, 16384 * 7168, 256, True, "staged"),   # 64 units
    ]
    kernels = {"tiles": "cq::quantize_groups_tiles<T,", "staged": "cq::quantize_groups_staged<S,",
               "held": "cq::quantize_groups<F,"}
    from cuquant._cuda import launch

    for t, n, g, aligned, where in cases:
        launch.clear_plans()  # each case asks for its kernel afresh
        del planned[:]
        _plan(t, n, g, aligned, policy=policy)
        want = where if on or where != "tiles" else (
            "staged" if n * t.numpy.itemsize >= policy.staged_min_bytes else "held")
        assert len(planned) == 1 and planned[0].startswith(kernels[want]), \
            (t.name, n, g, aligned, on, planned)


# ---------------------------------------------------------------------------------------
# Empty inputs and shapes

def test_empty_and_scalar_inputs():
    x = np.zeros((0, 16), np.float16)
    for bits, sym in itertools.product((4, 8), (False, True)):
        q, p = cq.quantize_groupwise(x, bits, sym, 8)
        assert q.shape == ((0, 8) if bits == 4 else (0, 16)) and p.shape == (0, 1 if sym else 2)
        back = cq.dequantize_groupwise(q, p, bits, sym, 8, "float32")
        assert back.shape == (0, 16)
    q, p = cq.quantize_groupwise(np.float32(3.0), 8, True, 1)
    assert q.shape == () and q.tolist() == 127 and p.shape == (1, 1)


# ---------------------------------------------------------------------------------------
# Refusals: the message names the function, the argument, the expectation and the value

X = np.ones((4, 256), dtype=np.float16)
Q8 = np.ones((4, 256), dtype=np.int8)
P2 = np.ones((8, 2), dtype=np.float32)

REFUSALS = [
    (cq.quantize_groupwise, (X, 3, True, 128), {}, ValueError, ["bits", "[4, 8]", "3"]),
    (cq.quantize_groupwise, (X, "4", True, 128), {}, TypeError, ["bits", "'4'"]),
    (cq.quantize_groupwise, (X, 4, "yes", 128), {}, TypeError, ["symmetric", "bool", "'yes'"]),
    (cq.quantize_groupwise, (X, 4, True, 100), {}, ValueError, ["group_size", "divide", "1024",
                                                                "100"]),
    (cq.quantize_groupwise, (X, 4, True, 0), {}, ValueError, ["group_size", ">= 1", "0"]),
    (cq.quantize_groupwise, (X, 4, True, 2.5), {}, TypeError, ["group_size", "2.5"]),
    (cq.quantize_groupwise, (X[:, :5], 4, True, 5), {}, ValueError, ["x", "even last axis",
                                                                     "(4, 5)"]),
    (cq.quantize_groupwise, (X.astype(np.float64), 8, True, 128), {}, TypeError, ["x", "float64"]),
    (cq.quantize_groupwise, ([1.0, 2.0], 8, True, 1), {}, TypeError, ["x", "list"]),
    (cq.dequantize_groupwise, (Q8, np.ones((8, 3), np.float32), 8, False, 128, "float16"), {},
     ValueError, ["params", "(8, 2)", "(8, 3)", "asymmetric"]),
    (cq.dequantize_groupwise, (Q8, np.ones((8, 2), np.float32), 8, True, 128, "float16"), {},
     ValueError, ["params", "(8, 1)", "(8, 2)", "symmetric"]),
    (cq.dequantize_groupwise, (Q8, P2.astype(np.float16), 8, False, 128, "float16"), {},
     TypeError, ["params", "float32", "float16"]),
    (cq.dequantize_groupwise, (Q8.view(np.uint8), P2, 8, False, 128, "float16"), {}, TypeError,
     ["q", "int8", "uint8"]),
    (cq.dequantize_groupwise, (Q8, P2, 8, False, 128, np.int32), {}, TypeError, ["dtype", "int32"]),
    (cq.dequantize_groupwise, (Q8, P2, 8, False, 100, "float32"), {}, ValueError,
     ["group_size", "divide", "1024", "100"]),
    (cq.dequantize_groupwise, (Q8, P2, 4, False, 128, "float32"), {}, ValueError,
     ["params", "(16, 2)", "(8, 2)"]),
    (cq.quantize_int4_per_group, (X[0],), {}, ValueError, ["w", "2-D", "(256,)"]),
    (cq.quantize_int4_per_group, (X,), {"group_size": 96}, ValueError, ["group_size", "K", "256",
                                                                         "96"]),
    (cq.quantize_int4_per_group, (X[:, :3],), {"group_size": 3}, ValueError, ["w", "even"]),
    (cq.dequantize_int4_per_group, (Q8, np.ones((8, 2), np.float32), "float16"), {}, ValueError,
     ["params", "(16, 2)", "(8, 2)"]),
    (cq.dequantize_int4_per_group, (Q8[0], P2, "float16"), {}, ValueError, ["packed", "2-D"]),
    (cq.dequantize_groupwise_batched, (Q8, "float16"), {}, TypeError, ["items[0]", "tuple"]),
    (cq.dequantize_groupwise_batched, ({"q": Q8}, "float16"), {}, TypeError, ["items", "dict"]),
    (cq.dequantize_groupwise_batched, ([(Q8, P2, 8, False)], "float16"), {}, TypeError,
     ["items[0]", "length 4"]),
    (cq.dequantize_groupwise_batched, ([{"q": Q8, "params": P2}], "float16"), {}, ValueError,
     ["items[0]", "bits", "symmetric", "group_size"]),
    (cq.dequantize_groupwise_batched, ([(Q8, P2, 8, False, 128), (Q8, P2[:3], 8, False, 128)],
                                       "float16"), {}, ValueError,
     ["items[1].params", "(8, 2)", "(3, 2)"]),
    (cq.dequantize_groupwise_batched, ([(Q8, P2, 5, False, 128)], "float16"), {}, ValueError,
     ["items[0].bits", "5"]),
    (cq.dequantize_groupwise_batched, ([(Q8, P2, 8, False, 128)], "int8"), {}, TypeError,
     ["dtype", "int8"]),
]


@pytest.mark.parametrize("fn,args,kwargs,exc,words", REFUSALS,
                         ids=[f"{r[0].__name__}-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals(fn, args, kwargs, exc, words):
    assert_refused(fn, args, kwargs, exc, words)


def _lowest_quotient(lo, hi, bits):
    """(lo - offset) * mult in float32 for asymmetric groups spanning [lo, hi], and which
    groups take the kernels' fast path (finite, nonzero mult and finite offset)."""
    mult, offset = group_multipliers(lo, hi, bits, False)
    with np.errstate(all="ignore"):
        v = ((lo - offset).astype(np.float32) * mult).astype(np.float32)
    return v, np.isfinite(mult) & (mult != 0) & np.isfinite(offset)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_asymmetric_quotients_of_16_bit_groups_need_no_lower_clamp(dtype):
    """The kernels skip the lower clamp of asymmetric codes for 16-bit input (groupwise.cu,
    DeepSpeed::encode): a group's smallest element, (lo - offset) * mult in float32, never
    falls below -2**(bits-1) (1 + 2**-15), so it rounds to -2**(bits-1) unclamped. Checked
    for lo and hi 1-64 and a few thousand values apart across every finite 16-bit value,
    and for 2**21 random pairs; float32 input breaks it (hi = lo + one ulp), which is why
    it keeps the clamp."""
    f32 = np.float32
    values = np.unique(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
                       .view(FLOATS[dtype].numpy).astype(f32))
    values = values[np.isfinite(values)]
    i, j = np.random.default_rng(7).integers(0, values.size, (2, 1 << 21))
    pairs = [(values[:-k], values[k:]) for k in list(range(1, 65)) + [100, 1000, 5000]]
    pairs.append((values[np.minimum(i, j)], values[np.maximum(i, j)]))
    worst = 0.0
    for (lo, hi), bits in itertools.product(pairs, (4, 8)):
        v, fast = _lowest_quotient(lo, hi, bits)
        worst = max(worst, float(np.max(-v[fast].astype(np.float64))) / (1 << (bits - 1)))
    assert worst <= 1 + 2.0 ** -15, worst
    lo = np.nextafter(f32(1000.0001), f32(np.inf))  # an odd last bit: hi + lo rounds up
    v, fast = _lowest_quotient(np.array([lo]), np.array([np.nextafter(lo, f32(np.inf))]), 8)
    assert fast[0] and v[0] == -256.0
