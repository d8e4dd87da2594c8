"""Scales that round: on the NumPy backend, against codes derived by hand.

A scale ``amax * f32(1/qmax)`` in the float32 subnormals is rounded by up to half its
size, so a quotient can pass qmax and must clamp (codes wrapped on the GPU before). A scale
stored in a 16-bit dtype (``scale_dtype``) is rounded too, and the codes are computed
against the scale as stored. The GPU tests compare the kernels with these results on the
same inputs (test_gpu.py, test_scales_that_round_down)."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cuquant as cq
from _util import assert_refused, assert_same_bits

U = np.float32(2.0 ** -149)  # one unit: the smallest float32 subnormal
BF16 = ml_dtypes.bfloat16


def units(*n) -> np.ndarray:
    return (np.array(n, np.float64) * float(U)).astype(np.float32)


# ---------------------------------------------------------------------------------------
# INT8: amax 190 units -> scale RN(190 * f32(1/127)) = RN(1.496) = 1 unit

ROW_190 = units(190, -190, 127, 128, 95, 1, 0, -3)
CODES_190 = [127, -127, 127, 127, 95, 1, 0, -3]


def _padded(row, k=32):
    return np.pad(row, (0, k - row.size))[None, :]


def test_int8_scale_of_one_unit_clamps():
    x = _padded(ROW_190)
    for q, s in (cq.quantize_int8_per_channel(x), cq.quantize_int8_per_block(x, 32),
                 cq.quantize_int8_per_tensor(x), cq.smooth_quant(x, np.ones(32, np.float32))):
        assert s.view(np.uint32).reshape(-1).tolist() == [1] * s.size
        assert q[0, :8].tolist() == CODES_190
        assert (q[0, 8:] == 0).all()


def test_int8_scale_just_below_a_power_of_two():
    # amax 443 units: 443 / 127 = 3.488 -> scale 3 units (just below 4). 443 / 3 = 147.7 and
    # 381 / 3 = 127 clamp to 127; 380 / 3 = 126.67 -> 127; 379 / 3 = 126.33 -> 126;
    # -7 / 3 = -2.33 -> -2; 4 / 3 -> 1; 3 / 2... 3 / 3 = 1.
    x = _padded(units(443, -443, 381, 380, 379, -7, 4, 3))
    q, s = cq.quantize_int8_per_channel(x)
    assert s.view(np.uint32).tolist() == [3]
    assert q[0, :8].tolist() == [127, -127, 127, 127, 126, -2, 1, 1]
    # amax 952 units: 952 / 127 = 7.496 -> 7 units (just below 8): 952 / 7 = 136 -> 127,
    # 889 / 7 = 127, 885 / 7 = 126.4 -> 126, 3.5 units' neighbours: 25 / 7 = 3.57 -> 4.
    x = _padded(units(952, 889, 885, -25))
    q, s = cq.quantize_int8_per_block(x, 32)
    assert s.view(np.uint32).tolist() == [[7]]
    assert q[0, :4].tolist() == [127, 127, 126, -4]


def test_int8_scale_that_underflows_is_raised_to_one_unit():
    # amax 63 units: 63 / 127 < 1/2 rounds to 0, raised to 1 unit; 63 / 1 = 63 (a zero
    # scale would give +-127 for +-inf quotients, and NaN for 0 / 0).
    x = _padded(units(63, -1, 0))
    for q, s in (cq.quantize_int8_per_channel(x), cq.quantize_int8_per_tensor(x),
                 cq.quantize_int8_per_block(x, 32)):
        assert s.view(np.uint32).reshape(-1).tolist() == [1]
        assert q[0, :3].tolist() == [63, -1, 0]


def test_fp8_scales_that_underflow_are_raised_to_one_unit():
    # amax 223 units: 223 * f32(1/448) < 1/2 unit rounds to 0, raised to 1 unit; the codes
    # are the units: 223 -> 224 (e=14, m=6: 0x76; steps of 16 there), -3 (0xC4), 0
    x = _padded(units(223, -3, 0))
    for q, s in (cq.quantize_fp8_per_tensor(x), cq.quantize_fp8_per_block(x),
                 cq.quantize_fp8_per_block(x, scale_format="ue8m0")):
        assert s.view(np.uint32).reshape(-1).tolist() == [1]
        assert q.view(np.uint8)[0, :3].tolist() == [0x76, 0xC4, 0x00]
    # an all-zero group with eps = 1 unit: max(0, eps) / 448 rounds to 0, raised to 1 unit;
    # zeros stay zeros (a zero scale would make them NaN)
    q, s = cq.quantize_fp8_per_token_group(np.zeros((1, 32), np.float32), 32, eps=1e-45)
    assert s.view(np.uint32).tolist() == [[1]]
    assert not q.view(np.uint8).any()


# ---------------------------------------------------------------------------------------
# FP8: amax 671 units -> scale RN(671 * f32(1/448)) = RN(1.498) = 1 unit

ROW_671 = units(671, -671, 500, 448, 300, 1, 0, -2)
# 671, 500 and 448 saturate to 448 (0x7E); 300 is nearest 288 (0x79); 1.0 is 0x38; -2.0 0xC0
CODES_671 = [0x7E, 0xFE, 0x7E, 0x7E, 0x79, 0x38, 0x00, 0xC0]


def test_fp8_scale_of_one_unit_saturates():
    x = _padded(ROW_671)
    for q, s in (cq.quantize_fp8_per_tensor(x), cq.quantize_fp8_per_block(x),
                 cq.quantize_fp8_per_token_group(x, 32, eps=1e-45)):
        assert s.view(np.uint32).reshape(-1).tolist() == [1] * s.size
        assert q.view(np.uint8)[0, :8].tolist() == CODES_671


# ---------------------------------------------------------------------------------------
# DeepSpeed's format and the zero point on the same rows

def test_deepspeed_multiplier_overflows_on_subnormal_groups():
    # m = 190 units: 2**bits / (2 m) overflows to inf, so x * mult is +-inf (clamped) and
    # 0 * inf is NaN (code 0); params 1 / inf = 0.
    x = ROW_190[None, :]
    q, p = cq.quantize_groupwise(x, 8, True, 8)
    assert q.tolist() == [[127, -128, 127, 127, 127, 127, 0, -128]]
    assert p.tolist() == [[0.0]]
    q, p = cq.quantize_groupwise(x, 4, True, 8)
    # nibbles 7, -8 | 7, 7 | 7, 7 | 0, -8, the first of a pair high
    assert q.view(np.uint8).tolist() == [[0x78, 0x77, 0x77, 0x08]]
    q, p = cq.quantize_groupwise(x, 8, False, 8)
    assert q.tolist() == [[127, -128, 127, 127, 127, 127, 0, -128]]
    assert p.tolist() == [[0.0, 0.0]]


def test_zero_point_floor_keeps_tiny_groups_at_zero():
    # bfloat16's smallest values: range floored at 1e-5, s = bf16(1e-5 / 15), every
    # quotient is below 1/2, so z = 0 and every code 0.
    x = np.tile((np.array([190, -190, 127, 1, 0, -3, 95, 64]) * 2.0 ** -133).astype(BF16), (1, 16))
    q, s, z, d = cq.quantize_groupwise_zero_point(x, 4, 128)
    assert (q == 0).all() and z.astype(np.float32).tolist() == [[0.0]]
    assert_same_bits(s, np.array([[np.float32(1e-5) / np.float32(15)]], np.float32).astype(BF16))


# ---------------------------------------------------------------------------------------
# scale_dtype: the scale rounded to the input's 16-bit dtype, codes against it

def test_int8_scale_stored_in_bfloat16_by_hand():
    w = np.array([[1.0, 0.5, -0.25, 0.0]], BF16)
    q, s = cq.quantize_int8_per_channel(w, scale_dtype="bfloat16")
    # f32(1/127) = 2**-7 * 1.0079 rounds to bfloat16 2**-7 * (1 + 1/128) = 0x3C01;
    # 1 / s = 127.006 -> 127, 0.5 / s = 63.503 -> 64, -0.25 / s = -31.75 -> -32.
    assert s.dtype == BF16 and s.view(np.uint16).tolist() == [0x3C01]
    assert q.tolist() == [[127, 64, -32, 0]]


def test_int8_scale_stored_in_float16_clamps():
    # amax 190 units of 2**-24 (a float16 subnormal): the float16 scale is one unit, so 190
    # clamps to 127; a float32 scale (190/127 units) gives 64 / 1.496 = 42.8 -> 43 instead.
    w = (np.array([[190, -190, 64, 1, 0]]) * 2.0 ** -24).astype(np.float16)
    q, s = cq.quantize_int8_per_channel(w, scale_dtype="float16")
    assert s.dtype == np.float16 and s.view(np.uint16).tolist() == [0x0001]
    assert q.tolist() == [[127, -127, 64, 1, 0]]
    q32, _ = cq.quantize_int8_per_channel(w)
    assert q32.tolist() == [[127, -127, 43, 1, 0]]


def test_fp8_per_row_scale_stored_in_bfloat16_by_hand():
    x = np.array([[448.0, 1.0, -3.0, 0.0]], BF16)
    q, s = cq.quantize_fp8_per_row(x, scale_dtype="bfloat16")
    # 448 * f32(1/448) is within an ulp of 1 and rounds to bfloat16 1.0: the codes are x.
    assert s.dtype == BF16 and s.astype(np.float32).tolist() == [1.0]
    assert q.view(np.uint8).tolist() == [[0x7E, 0x38, 0xC4, 0x00]]


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float16, BF16]), (4, 16),
                  elements=st.floats(-60000, 60000, width=16)))
def test_stored_scale_codes_equal_static_scale_codes(w):
    """Each row's codes are exactly those of the row quantized against its stored scale as
    a static scale (another path of the library), and the scale is the float32 scale
    rounded to the dtype."""
    name = np.dtype(w.dtype).name
    for quantize, static in ((cq.quantize_int8_per_channel, cq.quantize_int8_per_tensor),
                             (cq.quantize_fp8_per_row, cq.quantize_fp8_per_tensor)):
        q, s = quantize(w, scale_dtype=name)
        _, s32 = quantize(w)
        assert s.dtype == w.dtype
        assert_same_bits(s, s32.astype(w.dtype))
        for r in range(w.shape[0]):
            sr = float(np.float32(s[r]))
            if sr > 0:
                assert_same_bits(q[r], static(w[r:r + 1], scale=sr)[0][0])


@pytest.mark.parametrize("fn,args,kwargs,exc,words", [
    (cq.quantize_int8_per_channel, (np.zeros((2, 4), BF16),), {"scale_dtype": "float16"},
     ValueError, ["scale_dtype", "float32 or the input's dtype (bfloat16)", "float16"]),
    (cq.quantize_fp8_per_row, (np.zeros((2, 4), np.float32),), {"scale_dtype": "bfloat16"},
     ValueError, ["scale_dtype", "(float32)", "bfloat16"]),
    (cq.quantize_fp8_per_row, (np.zeros((2, 4), np.float32),), {"scale_dtype": "int8"},
     TypeError, ["scale_dtype", "float16, bfloat16, float32", "int8"]),
])
def test_scale_dtype_refusals(fn, args, kwargs, exc, words):
    assert_refused(fn, args, kwargs, exc, words)
