"""FP8 e4m3fn family on the NumPy backend: golden cases derived by hand (NaN / inf / zero
tiles, subnormal and underflowing scales, the column layout and its padding, ue8m0),
properties, empty inputs and refusals (docs/formats.md section 4)."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cuquant as cq
from _util import assert_refused, assert_same_bits

C448 = np.float32(1) / np.float32(448)
FP8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


def codes(q):
    return q.view(np.uint8).tolist()


# ---------------------------------------------------------------------------------------
# Golden cases

def test_static_scale_rounding_by_hand():
    x = np.array([448, 464, -1000, 2.0 ** -10, 1.5 * 2.0 ** -10, 0.1, np.nan, -0.0, 17, 19,
                  240, 232], dtype=np.float32)
    q, s = cq.quantize_fp8_per_tensor(x, scale=1.0)
    assert q.dtype == FP8 and s.tolist() == [1.0]
    # 448 max; 464 and -1000 clamp; 2**-10 ties to 0; 1.5*2**-10 -> smallest subnormal;
    # 0.1 -> 1.625*2**-4 (e=3, m=5); NaN -> 0x7F; -0 -> 0x80; 17 ties to 16 (m=0);
    # 19 ties to 20 (m=2); 240 = 1.875*2**7 (e=14, m=7); 232 ties to 224 (m=6).
    assert codes(q) == [0x7E, 0x7E, 0xFE, 0x00, 0x01, 0x1D, 0x7F, 0x80, 0x58, 0x5A, 0x77, 0x76]


def test_per_block_tiles_by_hand():
    w = np.zeros((130, 130), dtype=np.float32)
    w[0, 0], w[5, 7], w[127, 127] = 448.0, -224.0, 1.0     # tile (0, 0): amax 448 -> scale 1
    w[129, 0] = np.nan                                     # tile (1, 0): NaN
    w[128, 128], w[129, 129] = np.inf, -3.0                # tile (1, 1): inf
    q, s = cq.quantize_fp8_per_block(w)
    assert s.shape == (2, 2)
    assert s[0, 0] == 1.0 and s[0, 1] == 1.0              # all-zero tile (0, 1): scale 1
    assert s.view(np.uint32)[1, 0] == 0x7FFFFFFF and s[1, 1] == np.inf
    c = q.view(np.uint8)
    assert [c[0, 0], c[5, 7], c[127, 127], c[0, 1]] == [0x7E, 0xF6, 0x38, 0x00]
    assert np.all(c[0:128, 128:] == 0)
    assert np.all(c[128:, 0:128] == 0x7F)                 # x / NaN is NaN, zeros included
    # tile (1, 1): inf / inf = NaN; 0 / inf = 0; -3 / inf = -0
    assert [c[128, 128], c[128, 129], c[129, 129]] == [0x7F, 0x00, 0x80]


def test_subnormal_and_underflowing_scales():
    t = np.float32(2.0 ** -149)
    w = np.zeros((129, 256), dtype=np.float32)
    w[0, :3] = [1000 * t, -500 * t, 250 * t]   # tile (0, 0): scale RN(1000/448) t = 2 t
    w[128, :3] = [t, 0.0, -t]                  # tile (1, 0): amax t, t / 448 rounds to 0
    q, s = cq.quantize_fp8_per_block(w)
    assert s.tolist() == [[2 * t, 1.0], [t, 1.0]]  # ... and is raised to t
    c = q.view(np.uint8)
    # 500 -> clamp 448; -250 -> -256 (e=15, m=0); 125 -> 128 (e=14, m=0)
    assert c[0, :3].tolist() == [0x7E, 0xF8, 0x70]
    # scale t: 1, 0, -1, not the +-448 and NaN a zero scale would give
    assert c[128, :3].tolist() == [0x38, 0x00, 0xB8]


def test_per_row_floor_and_shape():
    x = np.zeros((2, 3, 4), dtype=np.float16)
    x[0, 0] = [1.0, -2.0, 0.5, 0.0]
    q, s = cq.quantize_fp8_per_row(x)
    assert q.shape == x.shape and s.shape == (2, 3)
    assert s[0, 0] == np.float32(2.0) * C448
    assert s[1, 2] == np.float32(1e-4) * C448              # all-zero rows meet the floor
    # 1 / (2/448) = 224 (e=14, m=6), -2 / (2/448) = -448, 0.5 / (2/448) = 112 (e=13, m=6)
    assert codes(q)[0][0] == [0x76, 0xFE, 0x6E, 0x00]


def test_token_group_column_layout_and_padding():
    x = np.zeros((5, 160), dtype=np.float32)
    x[:, 0] = [448, 224, 0, -1, 2]
    x[3, 130] = 7.0
    q, s = cq.quantize_fp8_per_token_group(x, group_size=128, scale_layout="column")
    assert s.shape == (5, 2) and s.strides == (4, 8 * 4)   # M stride rounded up to 8 = 4*2
    base = s.base if s.base is not None else s
    buf = np.asarray(base).reshape(2, 8)
    assert np.all(buf[:, 5:] == 0)                          # the padding is zero
    qr, sr = cq.quantize_fp8_per_token_group(x, group_size=128, scale_layout="row")
    assert_same_bits(qr, q)
    np.testing.assert_array_equal(sr, s)
    assert s[0, 0] == np.float32(448) * C448 and s[2, 0] == np.float32(1e-4) * C448
    assert s[3, 1] == np.float32(7) * C448


def test_token_group_ue8m0_scales_are_powers_of_two():
    x = np.zeros((2, 64), dtype=np.float32)
    x[0, 0], x[0, 1] = 300.0, 7.0
    x[1, 0] = 448.0 * 2.0 ** -5
    q, s = cq.quantize_fp8_per_token_group(x, group_size=32, scale_format="ue8m0")
    # 300/448 = 0.67 -> 1.0; 448*2**-5/448 = 2**-5 stays; empty groups: 1e-4/448 -> 2**-22
    assert s.tolist() == [[1.0, 2.0 ** -22], [2.0 ** -5, 2.0 ** -22]]
    # 300 / 1 -> 288 (e=15, m=1); 7 -> 7 (e=9, m=6); 448*2**-5 / 2**-5 = 448
    assert codes(q)[0][:2] == [0x79, 0x4E] and codes(q)[1][0] == 0x7E


def test_dequantize_by_hand():
    q = np.array([[0x7E, 0xFE, 0x01, 0x7F, 0x80]], dtype=np.uint8)
    out = cq.dequantize_fp8_per_tensor(q, np.array([2.0], np.float32), np.float32)
    assert out[0, :3].tolist() == [896.0, -896.0, 2.0 ** -8]
    assert np.isnan(out[0, 3]) and out.view(np.uint32)[0, 3] == 0x7FFFFFFF
    assert out.view(np.uint32)[0, 4] == 0x80000000        # -0 * 2 = -0
    same = cq.dequantize_fp8_per_tensor(q.view(FP8), np.float32([2.0]), np.float32)
    assert_same_bits(same, out)
    h = cq.dequantize_fp8_per_row(q, np.float32([1e-3]), "float16")
    assert h.dtype == np.float16 and h.view(np.uint16)[0, 3] == 0x7FFF


# ---------------------------------------------------------------------------------------
# Properties

finite = st.floats(-6e4, 6e4, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=300), elements=finite))
def test_per_block_matches_per_tensor_on_each_tile(w):
    q, s = cq.quantize_fp8_per_block(w)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            qt, st_ = cq.quantize_fp8_per_tensor(tile)
            assert_same_bits(q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128], qt)
            assert_same_bits(s[i:i + 1, j], st_)


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=300), elements=finite))
def test_per_block_ue8m0_is_per_tensor_against_the_rounded_scale(w):
    """UE8M0 tile scales: the smallest power of two at or above the float32 scale (1 for an
    all-zero tile), and each tile's codes those of a static per-tensor scale of that value."""
    q, s = cq.quantize_fp8_per_block(w, scale_format="ue8m0")
    _, s32 = cq.quantize_fp8_per_block(w)
    mant, _ = np.frexp(s.astype(np.float64))
    assert np.all(mant == 0.5) and np.all(s >= s32) and np.all(s < 2 * s32.astype(np.float64))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            qt, _ = cq.quantize_fp8_per_tensor(tile, scale=float(s[i, j]))
            assert_same_bits(q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128], qt)


def test_per_block_ue8m0_by_hand():
    w = np.zeros((130, 129), np.float32)
    w[0, 0] = 448.0 * 3  # scale 3 -> 4; 1344 / 4 = 336, a tie between e4m3 320 and 352
    w[129, 128] = -2.0 ** -130  # a subnormal scale, 1.14 * 2**-139, rounds up to 2**-138
    q, s = cq.quantize_fp8_per_block(w, scale_format="ue8m0")
    assert s.dtype == np.float32 and s.shape == (2, 2)
    assert s.tolist() == [[4.0, 1.0], [1.0, 2.0 ** -138]]
    assert float(q[0, 0]) == 320.0 and float(q[129, 128]) == -256.0  # -2**-130 / 2**-138


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=300), elements=finite),
       st.sampled_from([32, 64, 128, 256]))
def test_token_group_relative_error(x, g):
    q, s = cq.quantize_fp8_per_token_group(x, group_size=g)
    back = cq.dequantize_fp8_per_token_group(q, s, np.float32, group_size=g).astype(np.float64)
    step = np.repeat(s, g, axis=1)[:, :x.shape[1]].astype(np.float64)
    # e4m3 keeps 3 mantissa bits: relative error 2**-4, absolute 2**-10 near zero
    assert np.all(np.abs(back - x) <= np.maximum(np.abs(x) * 2.0 ** -4, step * 2.0 ** -10) * 1.0001)


def test_round_trip_bf16(rng):
    x = (rng.standard_normal((33, 300)) * 5).astype(BF16)
    q, s = cq.quantize_fp8_per_row(x)
    back = cq.dequantize_fp8_per_row(q, s, BF16).astype(np.float32)
    x32 = x.astype(np.float32)
    assert np.all(np.abs(back - x32) <= np.abs(x32) * (2.0 ** -4 + 2.0 ** -8) + s[:, None] * 2 ** -9)


@pytest.mark.parametrize("shape", [(0, 16), (16, 0)])
def test_empty_inputs(shape):
    x = np.zeros(shape, dtype=BF16)
    q, s = cq.quantize_fp8_per_block(x)
    assert q.shape == shape and q.dtype == FP8 and s.shape == tuple(-(-n // 128) for n in shape)
    q, s = cq.quantize_fp8_per_token_group(x, scale_layout="column")
    assert q.shape == shape and s.shape == (shape[0], -(-shape[1] // 128))
    q, s = cq.quantize_fp8_per_tensor(x)
    assert s.tolist() == [1.0]
    assert cq.dequantize_fp8_per_tensor(q, s, BF16).shape == shape


# ---------------------------------------------------------------------------------------
# Refusals

X = np.ones((4, 256), dtype=BF16)
Q = np.ones((4, 256), dtype=np.uint8)

REFUSALS = [
    (cq.quantize_fp8_per_token_group, (X,), {"group_size": 100}, ValueError, ["group_size", "100"]),
    (cq.quantize_fp8_per_token_group, (X,), {"eps": 0.0}, ValueError, ["eps"]),
    (cq.quantize_fp8_per_token_group, (X,), {"scale_layout": "col"}, ValueError,
     ["scale_layout", "'col'"]),
    (cq.quantize_fp8_per_token_group, (X,), {"scale_format": "e8m0"}, ValueError,
     ["scale_format"]),
    (cq.quantize_fp8_per_token_group, (X.view(np.int16),), {}, TypeError, ["x", "int16"]),
    (cq.quantize_fp8_per_token_group, (Q.view(FP8),), {}, TypeError, ["x", "float8_e4m3fn"]),
    (cq.quantize_fp8_per_block, (X,), {"block_size": (64, 64)}, ValueError, ["block_size"]),
    (cq.quantize_fp8_per_block, (X[0],), {}, ValueError, ["w", "(256,)"]),
    (cq.quantize_fp8_per_block, (X,), {"scale_format": "e8m0"}, ValueError,
     ["scale_format", "e8m0"]),
    (cq.quantize_fp8_per_block, (X,), {"policy": "tiles"}, TypeError,
     ["policy", "KernelPolicy", "str"]),
    (cq.quantize_fp8_per_row, (np.float32(1.0),), {}, ValueError, ["x", "got shape ()"]),
    (cq.quantize_fp8_per_tensor, (X,), {"scale": -1.0}, ValueError, ["scale"]),
    (cq.dequantize_fp8_per_token_group, (Q, np.ones((4, 1), np.float32), BF16), {}, ValueError,
     ["scale", "(4, 2)", "(4, 1)"]),
    (cq.dequantize_fp8_per_token_group, (Q, np.ones((4, 2), np.float32), BF16),
     {"group_size": 96}, ValueError, ["group_size"]),
    (cq.dequantize_fp8_per_block, (Q, np.ones((1, 1), np.float32), BF16), {}, ValueError,
     ["scale", "(1, 2)"]),
    (cq.dequantize_fp8_per_block, (Q.view(np.int8), np.ones((1, 2), np.float32), BF16), {},
     TypeError, ["q", "int8"]),
    (cq.dequantize_fp8_per_row, (Q, np.ones(5, np.float32), BF16), {}, ValueError,
     ["scale", "(4,)", "(5,)"]),
    (cq.dequantize_fp8_per_row, (Q, np.ones(4, np.float64), BF16), {}, TypeError,
     ["scale", "float64"]),
    (cq.dequantize_fp8_per_tensor, (Q, np.ones(1, np.float32), "float8"), {}, TypeError,
     ["dtype"]),
]


@pytest.mark.parametrize("fn,args,kwargs,exc,words", REFUSALS,
                         ids=[f"{r[0].__name__}-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals(fn, args, kwargs, exc, words):
    assert_refused(fn, args, kwargs, exc, words)
