"""The microscaling formats on the NumPy backend (docs/formats.md section 9): golden cases
derived by hand for each rule, the swizzled layout against its formula, round-trip error
bounds, stochastic rounding's bias, array families, empty inputs and refusals."""

import ml_dtypes
import numpy as np
import pytest

import cuquant as cq
from _util import assert_refused, assert_same_bits
from cuquant.zero_point import random_bits

BF16 = ml_dtypes.bfloat16
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.float32
GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def nibbles(q):
    b = np.asarray(q).view(np.uint8)
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],), np.uint8)
    out[..., 0::2], out[..., 1::2] = b & 15, b >> 4
    return out


def block(values, n=32, fill=0.0, dtype=F32):
    """One row of n elements: `values` first, then `fill`."""
    row = np.full(n, fill, np.float64)
    row[: len(values)] = values
    return row.astype(dtype).reshape(1, n)


def u8(a):
    return np.asarray(a).view(np.uint8)


# ---------------------------------------------------------------------------------------
# e2m1: rounding to nearest even on the grid, saturation, sign, NaN

def test_e2m1_ties_to_even_and_saturation():
    # 6 makes the scale 1 in both modes: rceil d = 6 * f32(1/6) = 1.0000000298 -> f32 1.0
    # (below half an ulp), a power of two (b = 127); floor ef(6) - 127 - 2 = 0 (b = 127).
    vals = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.26, 0.74, 5.01, -6.0, -0.1, -0.0,
            0.0, 1.0, 3.0, -2.5, 4.0, 2.0, 1.5, 0.5]
    want = [7, 0, 2, 2, 4, 4, 6, 6, 1, 1, 7, 15, 8, 8, 0, 2, 5, 12, 6, 4, 3, 1]
    for mode in ("rceil", "floor"):
        q, s = cq.quantize_mxfp4(block(vals), scale_mode=mode)
        assert q.dtype == np.uint8 and q.shape == (1, 16)
        assert s.dtype == E8M0 and u8(s).tolist() == [[127]]
        assert nibbles(q)[0, : len(vals)].tolist() == want
        # element 2i in the low nibble: (6 -> 7, 0.25 -> 0) packs as 0x07
        assert int(u8(q)[0, 0]) == 0x07


def test_e2m1_saturates_where_floor_leaves_amax_above_6():
    # floor: ef(7.5) = 129 -> b = 127, 7.5 saturates to 6 (code 7); rceil: d = 1.25 ->
    # b = 128 (scale 2), 7.5 / 2 = 3.75 -> 4 (code 6).
    q, s = cq.quantize_mxfp4(block([7.5, -7.5]), scale_mode="floor")
    assert u8(s).tolist() == [[127]] and nibbles(q)[0, :2].tolist() == [7, 15]
    q, s = cq.quantize_mxfp4(block([7.5, -7.5]), scale_mode="rceil")
    assert u8(s).tolist() == [[128]] and nibbles(q)[0, :2].tolist() == [6, 14]


def test_mxfp8_saturation_and_scales():
    # floor: ef(480) = 135 -> 135 - 127 - 8 = 0 -> b = 127: 480 clamps to 448 (0x7E);
    # rceil: d = 480 * f32(1/448) = 1.07 -> b = 128: 480 / 2 = 240 = 1.875 * 2**7 (0x77).
    q, s = cq.quantize_mxfp8(block([480.0, -480.0, 1.0]), scale_mode="floor")
    assert q.dtype == E4M3 and s.dtype == E8M0
    assert u8(s).tolist() == [[127]] and u8(q)[0, :3].tolist() == [0x7E, 0xFE, 0x38]
    q, s = cq.quantize_mxfp8(block([480.0, -480.0, 1.0]), scale_mode="rceil")
    # 1.0 / 2 = 0.5 = 2**-1: exponent field 6 -> 0x30
    assert u8(s).tolist() == [[128]] and u8(q)[0, :3].tolist() == [0x77, 0xF7, 0x30]


@pytest.mark.parametrize("k", [0, 1, 5, -3])
def test_rceil_at_powers_of_two(k):
    # MXFP4: d = 6 * 2**k * f32(1/6) = 2**k exactly -> b = 127 + k, no rounding up; the
    # next float above 6 * 2**k makes d's mantissa nonzero -> b = 128 + k.
    a = F32(6.0 * 2.0 ** k)
    _, s = cq.quantize_mxfp4(block([a]))
    assert u8(s).tolist() == [[127 + k]]
    _, s = cq.quantize_mxfp4(block([np.nextafter(a, F32(np.inf))]))
    assert u8(s).tolist() == [[128 + k]]
    # floor: 2**(ef(amax) - 127 - 2), for amax in [4 * 2**k, 8 * 2**k)
    _, s = cq.quantize_mxfp4(block([a]), scale_mode="floor")
    assert u8(s).tolist() == [[127 + k]]
    # MXFP8 floor at a power of two: amax = 2**(8 + k) -> b = 127 + k; 2**(8+k) / 2**k =
    # 2**8: exponent field 15, mantissa 0 -> 0x78
    q, s = cq.quantize_mxfp8(block([2.0 ** (8 + k)]), scale_mode="floor")
    assert u8(s).tolist() == [[127 + k]] and int(u8(q)[0, 0]) == 0x78


def test_zero_blocks_and_negative_zero():
    x = np.zeros((2, 64), F32)
    x[0, 5] = -0.0
    x[1, 40] = 3.0
    for mode in ("rceil", "floor"):
        q, s = cq.quantize_mxfp8(x, scale_mode=mode)
        assert u8(s)[0].tolist() == [0, 0] and u8(s)[1, 0] == 0   # amax 0 -> b = 0
        assert u8(q)[0, 5] == 0x80 and u8(q)[0, 4] == 0           # -0 keeps its sign
        q, s = cq.quantize_mxfp4(x, scale_mode=mode)
        assert u8(s)[0].tolist() == [0, 0]
        assert nibbles(q)[0, 5] == 8 and nibbles(q)[0, 4] == 0
    q, s, a = cq.quantize_nvfp4(x)
    assert a.tolist() == [3.0]
    assert u8(s)[0].tolist() == [0, 0, 0, 0]          # e4m3(0): r = min(1/0, FLT_MAX)
    assert nibbles(q)[0, 5] == 8 and nibbles(q)[0, 4] == 0   # +-0 * FLT_MAX


def test_all_zero_tensor_nvfp4():
    q, s, a = cq.quantize_nvfp4(np.zeros((3, 32), BF16))
    assert a.dtype == F32 and a.tolist() == [0.0]       # S_enc = 1
    assert u8(q).tolist() == [[0] * 16] * 3 and u8(s).tolist() == [[0, 0]] * 3
    assert_same_bits(cq.dequantize_nvfp4(q, s, a, "float32"), np.zeros((3, 32), F32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_infinity_in_a_block(bad):
    x = np.ones((1, 64), F32)
    x[0, 3] = bad
    # the second block (all ones): rceil MXFP8 d = f32(1/448) in [2**-9, 2**-8) with a
    # nonzero mantissa -> b = 127 - 9 + 1 = 119; floor: 0 - 8 -> b = 119 too.
    for mode in ("rceil", "floor"):
        q, s = cq.quantize_mxfp8(x, scale_mode=mode)
        assert u8(s).tolist() == [[0xFF, 119]]
        assert (u8(q)[0, :32] == 0x7F).all()            # x * NaN -> NaN -> 0x7F
        q, s = cq.quantize_mxfp4(x, scale_mode=mode)
        assert u8(s)[0, 0] == 0xFF and (nibbles(q)[0, :32] == 0).all()
        assert (nibbles(q)[0, 32:] != 0).all()           # the other block is untouched


def test_nan_and_infinity_nvfp4():
    x = np.ones((1, 32), F32)
    x[0, 2] = np.nan
    q, s, a = cq.quantize_nvfp4(x)            # A = NaN: S_enc NaN, every scale NaN
    assert np.isnan(a[0]) and (u8(s) == 0x7F).all() and (u8(q) == 0).all()
    q, s, a = cq.quantize_nvfp4(x, global_amax=2688.0)   # only the NaN block
    assert u8(s)[0, 0] == 0x7F and (nibbles(q)[0, :16] == 0).all()
    assert u8(s)[0, 1] != 0x7F and (nibbles(q)[0, 16:] != 0).all()
    x[0, 2] = -np.inf
    q, s, a = cq.quantize_nvfp4(x, global_amax=2688.0)
    # amax_b = inf: min(inf * f32(1/6), 448) = 448 (0x7E); -inf * r = -inf -> -6 (0xF)
    assert u8(s)[0, 0] == 0x7E and nibbles(q)[0, 2] == 15


def test_subnormal_amax():
    # MXFP8: amax 2**-130 (float32 subnormal): d = 2**-130 * f32(1/448) is subnormal with a
    # mantissa far below 0x400000 -> b = 0; floor: ef = 0 -> b = 0. x * 2**127 = 2**-3 -> 0x20.
    for mode in ("rceil", "floor"):
        q, s = cq.quantize_mxfp8(block([2.0 ** -130]), scale_mode=mode)
        assert u8(s).tolist() == [[0]] and int(u8(q)[0, 0]) == 0x20
    # MXFP4 rceil: f32(1/6) = 11184811 * 2**-26. amax 2**-124: d = 5592405.5 units of
    # 2**-149, rounded to even 5592406 > 0x400000 -> b = 1; amax 2**-125: 2796203 units,
    # below -> b = 0. Either way amax / scale = 4 (code 6).
    q, s = cq.quantize_mxfp4(block([2.0 ** -124]))
    assert u8(s).tolist() == [[1]] and nibbles(q)[0, 0] == 6
    q, s = cq.quantize_mxfp4(block([2.0 ** -125]))
    assert u8(s).tolist() == [[0]] and nibbles(q)[0, 0] == 6


def test_nvfp4_by_hand():
    # A = 2688: S_enc = 1, S_dec = 1, factor f32(1/6). A block of amax 6 * 2**j has
    # t = 2**j exactly: s = e4m3(2**j), r = 2**-j, codes on the grid.
    x = np.zeros((1, 80), F32)
    x[0, :4] = [6.0, 1.25, -0.75, 2.5]                 # s = 1.0 (0x38)
    x[0, 16:18] = [0.75, 0.25]                         # amax 0.75: t = 0.125 (0x20), r = 8
    x[0, 32:34] = [6.0 * 2.0 ** -8, 2.0 ** -8]         # t = 2**-8: subnormal e4m3 0x02
    x[0, 48:50] = [6.0 * 2.0 ** -10, -1e-4]            # t = 2**-10: ties to e4m3 0 -> r = FLT_MAX
    x[0, 64:66] = [6000.0, 1.0]                        # t = 1000 -> min 448 (0x7E)
    q, s, a = cq.quantize_nvfp4(x, global_amax=2688.0)
    assert a.tolist() == [2688.0] and s.dtype == E4M3
    assert u8(s).tolist() == [[0x38, 0x20, 0x02, 0x00, 0x7E]]
    c = nibbles(q)[0]
    assert c[:4].tolist() == [7, 2, 10, 4]
    assert c[16:18].tolist() == [7, 4]                 # 6 and 2
    assert c[32:34].tolist() == [7, 2]                 # r = 256: 6 and 1
    assert c[48:50].tolist() == [7, 15]                # anything nonzero * FLT_MAX saturates
    assert c[64:66].tolist() == [7, 0]                 # 6000 / 448 > 6; 1 / 448 -> 0
    # the same tensor without a global amax: A = 6000, the scales move, the rule is the same
    q2, s2, a2 = cq.quantize_nvfp4(x)
    assert a2.tolist() == [6000.0]


def test_nvfp4_dequantize_by_hand():
    q = np.array([[0x21, 0xF7] + [0] * 6], np.uint8)   # codes 1, 2, 7, 15: 0.5, 1, 6, -6
    s = np.array([[0x40]], np.uint8)                    # e4m3 2.0
    out = cq.dequantize_nvfp4(q, s, np.array([2688.0], F32), "float32")
    assert out[0, :4].tolist() == [1.0, 2.0, 12.0, -12.0]
    # A = 5376: S_enc = 0.5, S_dec = 2 -> scale 4
    out = cq.dequantize_nvfp4(q, s.view(E4M3), 5376.0, "float32")
    assert out[0, :4].tolist() == [2.0, 4.0, 24.0, -24.0]
    # A = 0 -> S_enc = 1
    assert cq.dequantize_nvfp4(q, s, 0.0, BF16)[0, :4].astype(F32).tolist() == [1, 2, 12, -12]


def test_mx_dequantize_by_hand():
    q = np.zeros((1, 32), np.uint8)
    q[0, :3] = [0x38, 0xB8, 0x01]                       # 1.0, -1.0, 2**-9
    for b, want in ((130, [8.0, -8.0, 2.0 ** -6]), (127, [1.0, -1.0, 2.0 ** -9]),
                    (0, [2.0 ** -127, -(2.0 ** -127), 2.0 ** -136])):
        out = cq.dequantize_mxfp8(q, np.array([[b]], np.uint8), "float32")
        assert out[0, :3].tolist() == want
    out = cq.dequantize_mxfp8(q, np.array([[255]], np.uint8).view(E8M0), BF16)
    assert (out.view(np.uint16) == 0x7FFF).all()        # NaN scale: canonical NaN
    packed = np.array([[0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE] + [0] * 8], np.uint8)
    out = cq.dequantize_mxfp4(packed, np.array([[128]], np.uint8), "float32")
    assert out[0, :16].tolist() == [2 * v for v in GRID] + [-2 * v for v in GRID]


def test_stochastic_rounding_by_hand():
    # 6 fixes the scale at 1. 0.3f = 10066330 * 2**-25: frac = 0.3f / 0.5 and
    # frac * 2**24 = 10066330 exactly, so up iff rbits >> 8 < 10066330.
    x = block([6.0, 0.3, 0.3, 0.3, 1.0, 7.0 / 8, 5.5, -0.3])
    r = np.zeros((1, 32), np.uint32)
    r[0, 1] = (10066329 << 8) | 0xFF   # up: 0.5
    r[0, 2] = 10066330 << 8            # down: 0
    r[0, 3] = 0xFFFFFFFF               # down
    r[0, 4] = 0                        # on the grid: frac 0, never up
    r[0, 5] = (1 << 24) - 1 << 8       # 0.875 between 0.5 and 1: frac 0.75 -> down at the top
    r[0, 6] = 0                        # 5.5 in [4, 6): frac 0.75 -> up to 6
    r[0, 7] = 0                        # -0.3: up in magnitude -> -0.5
    q, s = cq.quantize_mxfp4(x, rounding="stochastic", rbits=r)
    assert nibbles(q)[0, :8].tolist() == [7, 1, 0, 0, 2, 1, 7, 9]


def test_seed_draws_the_zero_point_words():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 64)).astype(BF16)
    for fn in (cq.quantize_mxfp4, cq.quantize_nvfp4):
        a = fn(x, rounding="stochastic", seed=12345)
        b = fn(x, rounding="stochastic", rbits=random_bits(x.shape, 12345))
        for u, w in zip(a, b):
            assert_same_bits(u, w)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_stochastic_rounding_is_unbiased(fmt):
    """The mean of many stochastic roundings of one value is the value (to 5 standard
    errors); rounding to nearest misses by far more than that bound."""
    vals = np.array([0.3, 1.1, 2.7, 4.6, -3.2, 5.9], F32)
    rows = 4096
    x = np.zeros((rows, 32), F32)
    x[:, 0] = 6.0                              # scale 1 (MXFP4), and A = 6 (NVFP4 below)
    x[:, 1:1 + len(vals)] = vals
    kw = {"global_amax": 2688.0} if fmt == "nvfp4" else {}
    fn = getattr(cq, f"quantize_{fmt}")
    deq = getattr(cq, f"dequantize_{fmt}")
    out = deq(*fn(x, rounding="stochastic", seed=2024, **kw), "float32")[:, 1:1 + len(vals)]
    near = deq(*fn(x, **kw), "float32")[:, 1:1 + len(vals)]
    bound = 5 * 2.0 / (2 * np.sqrt(rows))       # steps are at most 2: sd <= 1 a sample
    err = np.abs(out.mean(axis=0) - vals)
    assert (err < bound).all(), err
    assert (np.abs(near.mean(axis=0) - vals) > bound).all()


# ---------------------------------------------------------------------------------------
# The swizzled layout

def to_blocked(s: np.ndarray) -> np.ndarray:
    """The 128x4-tile layout as torchao describes it: pad to [128 * ceil(M/128),
    4 * ceil(C/4)], view as [R/128, 128, C'/4, 4], order the tiles row-major, and within a
    tile put the four 32-row bands side by side: [32, 4 * 4]."""
    m, c = s.shape
    rp, cp = 128 * -(-m // 128), 4 * -(-c // 4)
    pad = np.zeros((rp, cp), np.uint8)
    pad[:m, :c] = s
    tiles = pad.reshape(rp // 128, 128, cp // 4, 4).transpose(0, 2, 1, 3)   # [rb, cb, 128, 4]
    tiles = tiles.reshape(-1, 4, 32, 4).transpose(0, 2, 1, 3)               # [t, 32, 4, 4]
    return tiles.reshape(-1)


@pytest.mark.parametrize("m,k", [(1, 32), (130, 160), (257, 96), (128, 128), (5, 544)])
def test_swizzle_index_mapping(m, k, rng):
    x = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-20, 20, (m, 1))).astype(F32)
    q, s_row = cq.quantize_mxfp8(x)
    q2, s_swz = cq.quantize_mxfp8(x, scale_layout="swizzled")
    assert_same_bits(q2, q)
    c = k // 32
    rp, cp = 128 * -(-m // 128), 4 * -(-c // 4)
    assert s_swz.dtype == np.uint8 and s_swz.shape == (rp * cp,)
    r, col = np.meshgrid(np.arange(m), np.arange(c), indexing="ij")
    idx = (((r // 128) * (cp // 4) + col // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
           + col % 4)
    assert len(np.unique(idx)) == m * c
    assert (s_swz[idx] == u8(s_row)).all()
    pad = np.ones(rp * cp, bool)
    pad[idx.ravel()] = False
    assert (s_swz[pad] == 0).all()
    assert_same_bits(s_swz, to_blocked(u8(s_row)))
    # NVFP4's e4m3 scales take the same layout, and every dequantizer takes both
    p, sn, a = cq.quantize_nvfp4(x)
    p2, sn2, a2 = cq.quantize_nvfp4(x, scale_layout="swizzled")
    assert_same_bits(sn2, to_blocked(u8(sn)))
    assert_same_bits(cq.dequantize_nvfp4(p2, sn2, a2, BF16), cq.dequantize_nvfp4(p, sn, a, BF16))
    assert_same_bits(cq.dequantize_mxfp8(q2, s_swz, "float32"),
                     cq.dequantize_mxfp8(q, s_row, "float32"))


# ---------------------------------------------------------------------------------------
# Properties: the round trip is within half a grid step of each block

def _e4m3_step(v):
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -6)))
    return 2.0 ** (e - 3)


def _e2m1_step(v):
    a = np.abs(v)
    return np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16])
@pytest.mark.parametrize("mode", ["rceil", "floor"])
def test_round_trip_error(dtype, mode, rng):
    m, k = 64, 256
    x = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-8, 8, (m, 1))).astype(dtype)
    x32 = x.astype(np.float64)
    # MXFP8
    q, s = cq.quantize_mxfp8(x, scale_mode=mode)
    scale = np.repeat(u8(s).astype(np.float64) - 127, 32, axis=1)
    scale = 2.0 ** scale
    v = x32 / scale
    ok = np.abs(v) <= 448    # floor may saturate a block's top element
    err = np.abs(cq.dequantize_mxfp8(q, s, "float32").astype(np.float64) - x32)
    assert (err[ok] <= 0.5 * scale[ok] * _e4m3_step(v[ok])).all()
    if mode == "rceil":
        assert ok.all()      # rceil never saturates
    # MXFP4
    q, s = cq.quantize_mxfp4(x, scale_mode=mode)
    scale = 2.0 ** np.repeat(u8(s).astype(np.float64) - 127, 32, axis=1)
    v = x32 / scale
    ok = np.abs(v) <= 6
    err = np.abs(cq.dequantize_mxfp4(q, s, "float32").astype(np.float64) - x32)
    assert (err[ok] <= 0.5 * scale[ok] * _e2m1_step(v[ok])).all()
    if mode == "rceil":
        assert ok.all()
    # NVFP4: the block's scale f32(s) * S_dec. The e4m3 rounding of s may leave quotients
    # above 6: by 1/16 at most where s is normal (3 mantissa bits), more where it is
    # subnormal; those saturate to 6.
    p, sn, a = cq.quantize_nvfp4(x)
    enc = 2688.0 / float(a[0])
    sb = np.repeat(u8(sn), 16, axis=1)
    scale = sb.view(E4M3).astype(np.float64) / enc
    v = x32 / scale
    got = cq.dequantize_nvfp4(p, sn, a, "float32").astype(np.float64)
    err = np.abs(got - x32)
    ok = np.abs(v) <= 6
    assert (err[ok] <= 0.5 * scale[ok] * _e2m1_step(v[ok]) * (1 + 2.0 ** -20)).all()
    assert ((np.abs(v[~ok]) <= 6.375) | (sb[~ok] < 0x08)).all()
    # saturated: exactly 6 times the decode scale f32(f32(s) * S_dec), one rounding each
    s_dec = np.float32(1) / np.minimum(np.float32(2688) / a[0], np.finfo(np.float32).max)
    dec = sb.view(E4M3).astype(np.float32) * s_dec
    sat = cq.dequantize_nvfp4(p, sn, a, "float32")[~ok]
    assert sat.size  # blocks whose scale rounded down are there to check
    assert (np.abs(sat) == np.float32(6) * dec[~ok]).all()


# ---------------------------------------------------------------------------------------
# Families and types

def test_torch_and_jax_types():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    q, s = cq.quantize_mxfp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    qn, sn = cq.quantize_mxfp8(x.view(torch.int16).numpy().view(BF16))
    assert_same_bits(q.view(torch.uint8).numpy(), u8(qn))
    assert_same_bits(s.view(torch.uint8).numpy(), u8(sn))
    back = cq.dequantize_mxfp8(q, s, torch.bfloat16)
    assert back.dtype == torch.bfloat16
    p, s4 = cq.quantize_mxfp4(x)
    assert p.dtype == torch.uint8 and s4.dtype == torch.float8_e8m0fnu
    # packed codes as torch's float4_e2m1fn_x2 are taken as their bytes
    assert_same_bits(cq.dequantize_mxfp4(p.view(torch.float4_e2m1fn_x2), s4, "float32"),
                     cq.dequantize_mxfp4(p, s4, "float32"))
    p, sn, a = cq.quantize_nvfp4(x)
    assert sn.dtype == torch.float8_e4m3fn and a.dtype == torch.float32
    _, swz = cq.quantize_mxfp8(x, scale_layout="swizzled")
    assert swz.dtype == torch.uint8 and swz.shape == (128 * 4,)
    jnp = pytest.importorskip("jax.numpy")
    xj = jnp.asarray(x.float().numpy()).astype(jnp.bfloat16)
    qj, sj = cq.quantize_mxfp8(xj)
    assert qj.dtype == jnp.float8_e4m3fn and sj.dtype == jnp.float8_e8m0fnu
    assert_same_bits(np.asarray(sj).view(np.uint8), u8(cq.quantize_mxfp8(np.asarray(xj))[1]))
    assert cq.dequantize_mxfp8(qj, sj, "float32").dtype == jnp.float32


@pytest.mark.parametrize("shape", [(0, 64), (3, 0), (0, 0)])
def test_empty_inputs(shape):
    x = np.zeros(shape, BF16)
    m, k = shape
    q, s = cq.quantize_mxfp8(x)
    assert q.shape == (m, k) and s.shape == (m, k // 32)
    q, s = cq.quantize_mxfp4(x, scale_layout="swizzled")
    assert q.shape == (m, k // 2) and s.shape == (128 * -(-m // 128) * 4 * -(-(k // 32) // 4),)
    q, s, a = cq.quantize_nvfp4(x)
    assert q.shape == (m, k // 2) and s.shape == (m, k // 16) and a.tolist() == [0.0]
    assert cq.dequantize_nvfp4(q, s, a, "float32").shape == (m, k)


# ---------------------------------------------------------------------------------------
# Refusals

_X = np.zeros((4, 64), F32)
_Q8, _S8 = cq.quantize_mxfp8(_X)
_Q4, _S4 = cq.quantize_mxfp4(_X)
_QN, _SN, _AN = cq.quantize_nvfp4(_X)

REFUSALS = [
    (cq.quantize_mxfp8, (np.zeros((4, 48), F32),), {}, ValueError, ["x", "multiple", "32", "(4, 48)"]),
    (cq.quantize_mxfp4, (np.zeros((4, 40), F32),), {}, ValueError, ["x", "32", "(4, 40)"]),
    (cq.quantize_nvfp4, (np.zeros((4, 40), F32),), {}, ValueError, ["x", "16", "(4, 40)"]),
    (cq.quantize_mxfp8, (np.zeros(64, F32),), {}, ValueError, ["x", "2-D", "(64,)"]),
    (cq.quantize_mxfp8, (np.zeros((4, 64), np.int32),), {}, TypeError, ["x", "float16", "int32"]),
    (cq.quantize_mxfp8, (_X,), {"scale_mode": "ceil"}, ValueError, ["scale_mode", "rceil", "'ceil'"]),
    (cq.quantize_mxfp4, (_X,), {"scale_layout": "column"}, ValueError,
     ["scale_layout", "swizzled", "'column'"]),
    (cq.quantize_mxfp4, (_X,), {"rounding": "up"}, ValueError, ["rounding", "stochastic", "'up'"]),
    (cq.quantize_mxfp4, (_X,), {"rounding": "stochastic"}, ValueError,
     ["rbits", "seed", "neither"]),
    (cq.quantize_mxfp4, (_X,), {"seed": 3}, ValueError, ["seed", "nearest"]),
    (cq.quantize_mxfp4, (_X,), {"rounding": "stochastic", "rbits": np.zeros((4, 32), np.uint32)},
     ValueError, ["rbits", "(4, 64)", "(4, 32)"]),
    (cq.quantize_nvfp4, (_X,), {"rounding": "stochastic", "rbits": np.zeros((4, 64), np.int32)},
     TypeError, ["rbits", "uint32", "int32"]),
    (cq.quantize_nvfp4, (_X,), {"rounding": "stochastic", "seed": -1}, ValueError,
     ["seed", "2**64", "-1"]),
    (cq.quantize_nvfp4, (_X,), {"global_amax": 0.0}, ValueError, ["global_amax", "> 0", "0.0"]),
    (cq.quantize_nvfp4, (_X,), {"global_amax": float("nan")}, ValueError,
     ["global_amax", "finite", "nan"]),
    (cq.quantize_nvfp4, (_X,), {"global_amax": 1e39}, ValueError, ["global_amax", "float32", "1e+39"]),
    (cq.quantize_nvfp4, (_X,), {"global_amax": np.array([1.0, 2.0], F32)}, ValueError,
     ["global_amax", "one value", "(2,)"]),
    (cq.quantize_nvfp4, (_X,), {"global_amax": np.array([1.0])}, TypeError,
     ["global_amax", "float32", "float64"]),
    (cq.quantize_nvfp4, (_X,), {"global_amax": np.array([-1.0], F32)}, ValueError,
     ["global_amax", "> 0", "-1.0"]),
    (cq.quantize_nvfp4, (_X,), {"global_amax": True}, TypeError,
     ["global_amax", "number or a float32 array", "True"]),
    (cq.dequantize_mxfp8, (_Q8, _S8[:, :1], "float32"), {}, ValueError,
     ["scales", "(4, 2)", "(512,)", "(4, 1)"]),
    (cq.dequantize_mxfp8, (_Q8, np.zeros(100, np.uint8), "float32"), {}, ValueError,
     ["scales", "swizzled", "(100,)"]),
    (cq.dequantize_mxfp8, (_Q8, u8(_S8).astype(F32), "float32"), {}, TypeError,
     ["scales", "float8_e8m0fnu", "float32"]),
    (cq.dequantize_mxfp8, (_Q8.view(np.int8), _S8, "float32"), {}, TypeError,
     ["q", "float8_e4m3fn", "int8"]),
    (cq.dequantize_mxfp8, (_Q8[:, :48], _S8, "float32"), {}, ValueError, ["q", "32", "(4, 48)"]),
    (cq.dequantize_mxfp4, (_Q4, _S4, "int8"), {}, TypeError, ["dtype", "float16", "int8"]),
    (cq.dequantize_mxfp4, (_Q4, _S4.T, "float32"), {}, ValueError, ["scales", "(4, 2)", "(2, 4)"]),
    (cq.dequantize_mxfp4, (_Q4.view(np.int8), _S4, "float32"), {}, TypeError,
     ["q", "uint8", "int8"]),
    (cq.dequantize_nvfp4, (_QN, u8(_S4), _AN, "float32"), {}, ValueError,
     ["scales", "(4, 4)", "(4, 2)"]),
    (cq.dequantize_nvfp4, (_QN, u8(_SN).view(E8M0), _AN, "float32"), {}, TypeError,
     ["scales", "float8_e4m3fn", "float8_e8m0fnu"]),
    (cq.dequantize_nvfp4, (_QN, _SN, np.zeros(2, F32), "float32"), {}, ValueError,
     ["global_amax", "one value", "(2,)"]),
    (cq.dequantize_nvfp4, (_QN, _SN, np.zeros(1, np.float64), "float32"), {}, TypeError,
     ["global_amax", "float32", "float64"]),
    (cq.dequantize_nvfp4, (_QN, _SN, False, "float32"), {}, TypeError,
     ["global_amax", "number or a float32 array", "False"]),
]


@pytest.mark.parametrize("fn,args,kwargs,exc,words", REFUSALS,
                         ids=[f"{r[0].__name__}-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals(fn, args, kwargs, exc, words):
    assert_refused(fn, args, kwargs, exc, words)
