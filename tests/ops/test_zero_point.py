"""Group-wise quantization with a zero point and stochastic rounding on the NumPy backend
(docs/formats.md section 6): golden cases by hand, the counter-based generator, unbiasedness of
stochastic rounding, properties, empty inputs and refusals."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cuquant as cq
from _util import assert_refused, assert_same_bits
from cuquant.zero_point import random_bits
from cuquant._numpy.zero_point import philox4x32_10

BF16 = ml_dtypes.bfloat16
F32 = np.float32


def unpack_low_first(q):
    b = np.asarray(q).view(np.uint8)
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],), np.uint8)
    out[..., 0::2], out[..., 1::2] = b & 15, b >> 4
    return out


# ---------------------------------------------------------------------------------------
# Golden cases

def test_4bit_packing_first_element_low():
    x = np.arange(16, dtype=np.float16).reshape(1, 16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 16)
    # lo 0, hi 15: s = 15 / 15 = 1, z = rne(-0 / 1) = 0, q = x
    assert q.dtype == np.uint8 and q.shape == (1, 8)
    assert q.tolist() == [[0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]]
    assert s.dtype == np.float16 and s.tolist() == [[1.0]]
    assert z.view(np.uint16).tolist() == [[0]]   # +0
    assert_same_bits(deq, x)


def test_zero_point_shifts_negative_ranges():
    x = np.arange(-8, 8, dtype=np.float16).reshape(1, 16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 16)
    assert unpack_low_first(q).tolist() == [list(range(16))] and z.tolist() == [[8.0]]
    assert_same_bits(deq, x)
    # 8 bits: one code a byte; lo -1, hi 254: s = 255 / 255 = 1, z = 1
    x = np.array([[-1.0, 0.0, 1.0, 254.0]], dtype=BF16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 8, 4)
    assert q.dtype == np.uint8 and q.tolist() == [[0, 1, 2, 255]]
    assert s.dtype == BF16 and s.tolist() == [[1.0]] and z.tolist() == [[1.0]]
    assert_same_bits(deq, x)


def test_ties_round_to_even():
    x = np.array([[0.0, 15.0, 2.5, 3.5, 0.5, 14.5]], dtype=np.float16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 6)
    assert unpack_low_first(q).tolist() == [[0, 15, 2, 4, 0, 14]]
    assert deq.tolist() == [[0.0, 15.0, 2.0, 4.0, 0.0, 14.0]]


def test_constant_and_zero_groups_take_the_range_floor():
    # range = max(0, f32(1e-5)); s = f16(1e-5 / 15) = 11 * 2**-24 (a float16 subnormal)
    x = np.array([[5.0] * 4 + [0.0] * 4 + [-5.0] * 4], dtype=np.float16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 4)
    assert s.view(np.uint16).tolist() == [[0x000B] * 3]
    # 5: z = clamp(rne(-5 / s)) = 0, q = clamp(huge) = 15, deq = 15 s = 165 * 2**-24
    # 0: z = 0, q = 0; -5: z = 15, q = clamp(-huge + 15) = 0, deq = -15 s
    assert z.tolist() == [[0.0, 0.0, 15.0]]
    assert unpack_low_first(q).tolist() == [[15] * 4 + [0] * 4 + [0] * 4]
    assert deq.view(np.uint16).tolist() == [[0x00A5] * 4 + [0] * 4 + [0x80A5] * 4]


def test_nan_and_inf_groups():
    x = np.array([[1.0, np.nan, 2.0, 3.0, 1.0, np.inf, 0.0, 2.0]], dtype=np.float16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 4)
    # NaN: s NaN, z 0, codes 0, reconstruction NaN; inf: s = inf, x / inf = 0 or NaN -> 0,
    # and (0 - 0) * inf = NaN
    assert s.view(np.uint16).tolist() == [[0x7FFF, 0x7C00]]
    assert z.tolist() == [[0.0, 0.0]] and q.tolist() == [[0, 0, 0, 0]]
    assert deq.view(np.uint16).tolist() == [[0x7FFF] * 8]


def test_stochastic_rounding_by_hand():
    # s = 1, z = 0; 2.25 rounds up when f32(rbits >> 8) < 0.25 * 2**24 = 4194304
    x = np.array([[0.0, 15.0, 2.25, 2.25, 2.25, 7.0]], dtype=np.float16)
    rbits = np.array([[0xFFFFFFFF, 0xFFFFFFFF, (4194303 << 8) | 0xFF, 4194304 << 8, 0, 0]],
                     dtype=np.uint32)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 6, "stochastic", rbits=rbits)
    # frac 0 never rounds up (r24 < 0 is false), whatever the word
    assert unpack_low_first(q).tolist() == [[0, 15, 3, 2, 3, 7]]
    assert deq.tolist() == [[0.0, 15.0, 3.0, 2.0, 3.0, 7.0]]


def test_symmetric_by_hand():
    # amax 15: s = 15 / 7.5 = 2, z = 8; x / s = -7.5 -> -8 (tie to even) -> code 0,
    # 7.5 -> 8 -> 16, clamped to 15 (as compressed-tensors' symmetric observer does)
    x = np.array([[-15.0, 15.0, 3.0, -3.0, 5.0, 0.0, 1.0, -1.0]], dtype=np.float16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 8, symmetric=True)
    assert s.tolist() == [[2.0]] and z.tolist() == [[8.0]]
    # 3 / 2 = 1.5 -> 2; -1.5 -> -2; 2.5 -> 2; 0.5 -> 0; -0.5 -> -0
    assert unpack_low_first(q).tolist() == [[0, 15, 10, 6, 10, 8, 8, 8]]
    assert deq.tolist() == [[-16.0, 14.0, 4.0, -4.0, 4.0, 0.0, 0.0, 0.0]]
    # 8 bits: amax 255: s = 255 / 127.5 = 2, z = 128
    x = np.array([[-255.0, 255.0, 3.0, -1.0]], dtype=BF16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 8, 4, symmetric=True)
    assert s.tolist() == [[2.0]] and z.tolist() == [[128.0]]
    assert q.tolist() == [[0, 255, 130, 128]]
    assert deq.tolist() == [[-256.0, 254.0, 4.0, 0.0]]


def test_symmetric_scale_is_rounded_and_codes_use_it():
    # amax 1: s = bf16(1 / 7.5) = bf16(0.1333...) = 0.1337890625 (0x3E09); codes divide by
    # that stored value: 1 / 0.13379 = 7.474 -> 7, 0.5 / 0.13379 = 3.737 -> 4
    x = np.array([[-1.0, 0.5, 0.25, 1.0]], dtype=BF16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 4, symmetric=True)
    assert s.view(np.uint16).tolist() == [[0x3E09]]
    assert unpack_low_first(q).tolist() == [[1, 12, 10, 15]]
    want = (np.array([-7, 4, 2, 7], F32) * F32(0.1337890625)).astype(BF16)
    assert_same_bits(deq, want.reshape(1, 4))
    back = cq.dequantize_groupwise_zero_point(q, s, z, 4, "bfloat16")
    assert_same_bits(back, deq)


def test_symmetric_zero_and_nan_groups():
    # amax floor f32(1e-5): s = f16(1e-5 / 7.5) = 22 * 2**-24; zeros give code 8, value 0
    x = np.array([[0.0] * 4 + [1.0, np.nan, 2.0, 3.0]], dtype=np.float16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 4, symmetric=True)
    assert s.view(np.uint16).tolist() == [[0x0016, 0x7FFF]]
    assert z.tolist() == [[8.0, 8.0]]
    assert unpack_low_first(q).tolist() == [[8] * 4 + [0] * 4]
    assert deq.view(np.uint16).tolist() == [[0] * 4 + [0x7FFF] * 4]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_symmetric_matches_its_definition(rng, bits, dtype):
    x = (rng.standard_normal((6, 256)) * np.exp(rng.standard_normal((6, 1)))).astype(dtype)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, bits, 64, symmetric=True)
    half = F32(((1 << bits) - 1) / 2)
    xg = x.astype(F32).reshape(6, 4, 64)
    amax = np.abs(xg).max(axis=-1)
    s_want = (np.maximum(amax, F32(1e-5)) / half).astype(F32).astype(dtype)
    assert_same_bits(s, s_want)
    codes = np.clip(np.rint(xg / s_want.astype(F32)[..., None]) + (1 << (bits - 1)), 0,
                    (1 << bits) - 1).astype(np.uint8).reshape(6, 256)
    got = unpack_low_first(q) if bits == 4 else q
    assert np.array_equal(got, codes)
    assert (z == (1 << (bits - 1))).all()


def test_philox_known_answers():
    # Random123's published vectors for Philox4x32-10
    assert [int(w) for w in philox4x32_10((0, 0, 0, 0), (0, 0))] == \
        [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert [int(w) for w in philox4x32_10((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2)] == \
        [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert [int(w) for w in philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
                                          (0xA4093822, 0x299F31D0))] == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_random_bits_counter_layout():
    # element i takes word i % 4 of the block for counter (i // 4 low word, i // 4 high
    # word, 0, 0) and key (seed low word, seed high word)
    seed = (7 << 32) | 3
    r = random_bits((3, 5), seed).reshape(-1)
    for i in range(15):
        assert r[i] == philox4x32_10((i // 4, 0, 0, 0), (3, 7))[i % 4]
    assert random_bits((3, 5), seed).dtype == np.uint32
    # a slice of a larger tensor: the words of elements offset, offset + 1, ...
    assert_same_bits(random_bits((2, 3), seed, offset=7), r[7:13].reshape(2, 3))


def test_seed_is_rbits_from_the_generator(rng):
    x = (rng.standard_normal((6, 256)) * 2).astype(BF16)
    for bits in (4, 8):
        a = cq.quantize_groupwise_zero_point(x, bits, 64, "stochastic", seed=12345)
        b = cq.quantize_groupwise_zero_point(x, bits, 64, "stochastic",
                                             rbits=random_bits(x.shape, 12345))
        for u, v in zip(a, b):
            assert_same_bits(u, v)
        c = cq.quantize_groupwise_zero_point(x, bits, 64, "stochastic", seed=12346)
        assert not np.array_equal(a[0], c[0])


def test_dequantize_inverts_the_reconstruction(rng):
    x = (rng.standard_normal((5, 384)) * 3).astype(np.float16)
    for bits in (4, 8):
        for g in (32, 128, 3):
            q, s, z, deq = cq.quantize_groupwise_zero_point(x, bits, g)
            assert_same_bits(cq.dequantize_groupwise_zero_point(q, s, z, g, np.float16), deq)
            assert_same_bits(cq.dequantize_groupwise_zero_point(q, s, z, g, "float16", bits=bits),
                             deq)
            out = cq.dequantize_groupwise_zero_point(q, s, z, g, np.float32)
            assert out.dtype == np.float32 and out.shape == x.shape
            assert_same_bits(out.astype(np.float16), deq)   # one rounding either way


def test_odd_groups_share_bytes(rng):
    x = (rng.standard_normal((2, 6)) * 3).astype(np.float16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 3)
    assert q.shape == (2, 3) and s.shape == (2, 2)
    # the contract written out in float32, group by group
    g = x.astype(np.float32).reshape(4, 3)
    lo, hi = g.min(axis=1), g.max(axis=1)
    s_want = (np.maximum(hi - lo, F32(1e-5)) / F32(15)).astype(np.float16)
    sf = s_want.astype(np.float32)
    z_want = np.clip(np.rint(-lo / sf), 0, 15)
    q_want = np.clip(np.rint(g / sf[:, None]) + z_want[:, None], 0, 15)
    assert_same_bits(s, s_want.reshape(2, 2))
    assert z.astype(np.float32).reshape(-1).tolist() == z_want.tolist()
    assert unpack_low_first(q).reshape(-1).tolist() == q_want.reshape(-1).astype(int).tolist()
    # a byte spans two groups: groups are runs of the flattened tensor
    flat = cq.quantize_groupwise_zero_point(x.reshape(1, 12), 4, 3)
    assert_same_bits(flat[0].reshape(2, 3), q)
    assert_same_bits(flat[3].reshape(2, 6), deq)


# ---------------------------------------------------------------------------------------
# Stochastic rounding is unbiased

def test_stochastic_rounding_is_unbiased(rng):
    """Many draws of one group: the mean reconstruction converges to x (within a few
    standard errors), while rounding to nearest keeps its deterministic error."""
    row = np.linspace(-1.3, 2.9, 128).astype(np.float16)
    row[5:9] = [0.1234, -0.777, 1.0001, 2.5003]
    draws = 4000
    x = np.tile(row, (draws, 1))
    q, s, z, _ = cq.quantize_groupwise_zero_point(x, 4, 128, "stochastic", seed=2024)
    codes = unpack_low_first(q).astype(np.float64)
    recon = (codes - z.astype(np.float64)) * s.astype(np.float64)   # exact, no dtype rounding
    step, zero = float(s[0, 0]), float(z[0, 0])
    mean = recon.mean(axis=0)
    err = np.abs(mean - row.astype(np.float64))
    # each draw is within one step, and its variance at most step**2 / 4; values beyond
    # the last code, (15 - z) s, clip (the zero point is rounded), so they are left out
    assert np.all(np.abs(recon - row.astype(np.float64)) <= step * (1 + 1e-6))
    inside = (row >= -zero * step) & (row <= (15 - zero) * step)
    assert inside.sum() > 120
    err = err[inside]
    assert err.max() <= 6 * step / (2 * np.sqrt(draws))
    qn, sn, zn, _ = cq.quantize_groupwise_zero_point(row[None], 4, 128)
    near = (unpack_low_first(qn)[0] - float(zn[0, 0])) * float(sn[0, 0])
    near_err = np.abs(near - row.astype(np.float64))[inside]
    assert near_err.mean() > 5 * err.mean()   # nearest is biased element by element
    # and the draws are not all alike: both neighbours occur for a fractional quotient
    assert len(np.unique(codes[:, 6])) == 2


# ---------------------------------------------------------------------------------------
# Properties

halves = st.floats(-6e4, 6e4, allow_nan=False, allow_infinity=False, width=16)


@settings(max_examples=80, deadline=None)
@given(hnp.arrays(np.float16, st.tuples(st.integers(1, 6), st.sampled_from([32, 64, 96, 192])),
                  elements=halves),
       st.sampled_from([4, 8]), st.sampled_from([32, 96]), st.booleans())
def test_round_trip_error(x, bits, g, stochastic):
    if x.shape[1] % g:
        g = 32
    kw = {"rounding": "stochastic", "seed": 99} if stochastic else {}
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, bits, g, **kw)
    x32 = x.astype(np.float64).reshape(-1, g)
    s64 = s.astype(np.float64).reshape(-1, 1)
    codes = (unpack_low_first(q) if bits == 4 else q).astype(np.float64).reshape(-1, g)
    recon = (codes - z.astype(np.float64).reshape(-1, 1)) * s64
    # Codes cover [-z s, (qmax - z) s]: inside, the error is half a step (a step for
    # stochastic rounding); beyond it (the zero point and s are rounded, and a range that
    # holds no zero clamps z, as in lmdeploy) values clip to the end. Ranges under 1e-3
    # take the 1e-5 floor and are left out.
    qmax = (1 << bits) - 1
    z64 = z.astype(np.float64).reshape(-1, 1)
    lo, hi = x32.min(axis=1, keepdims=True), x32.max(axis=1, keepdims=True)
    over = np.maximum(0, np.maximum(hi - (qmax - z64) * s64, -z64 * s64 - lo))
    wide = (hi - lo > 1e-3)[:, 0]
    bound = s64 * ((1.0 if stochastic else 0.5) + 1e-3) + over
    assert np.all((np.abs(recon - x32) <= bound)[wide])
    # when the range holds zero, rounding s (float16: 11 bits) and z lose under a step
    holds = wide & (lo[:, 0] <= 0) & (hi[:, 0] >= 0)
    assert np.all((over <= s64 * (0.5 + qmax * 2.0 ** -11 + 1e-3))[holds])
    assert np.all(codes >= 0) and np.all(codes <= (1 << bits) - 1)
    # the returned reconstruction is that value rounded once to the input dtype
    assert_same_bits(deq, recon.astype(np.float32).astype(np.float16).reshape(x.shape))


# ---------------------------------------------------------------------------------------
# Empty inputs

def test_empty_inputs():
    x = np.zeros((0, 256), np.float16)
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 4, 128)
    assert q.shape == (0, 128) and s.shape == (0, 2) and z.shape == (0, 2) and deq.shape == (0, 256)
    out = cq.dequantize_groupwise_zero_point(q, s, z, 128, "float32")
    assert out.shape == (0, 256) and out.dtype == np.float32
    q, s, z, deq = cq.quantize_groupwise_zero_point(x, 8, 128, "stochastic", seed=1)
    assert q.shape == (0, 256)


# ---------------------------------------------------------------------------------------
# Refusals

X = np.ones((4, 256), dtype=np.float16)
R = np.zeros((4, 256), dtype=np.uint32)
QZ, SZ, ZZ, _ = cq.quantize_groupwise_zero_point(X, 4, 128)

REFUSALS = [
    (cq.quantize_groupwise_zero_point, (X.astype(np.float32),), {}, TypeError,
     ["x", "float16 or bfloat16", "float32"]),
    (cq.quantize_groupwise_zero_point, (X[None],), {}, ValueError, ["x", "2-D", "(1, 4, 256)"]),
    (cq.quantize_groupwise_zero_point, (X,), {"group_size": 100}, ValueError,
     ["group_size", "divide", "256", "100"]),
    (cq.quantize_groupwise_zero_point, (X[:, :3],), {"group_size": 3}, ValueError,
     ["x", "even K", "(4, 3)"]),
    (cq.quantize_groupwise_zero_point, (X,), {"bits": 2}, ValueError, ["bits", "2"]),
    (cq.quantize_groupwise_zero_point, (X,), {"rounding": "floor"}, ValueError,
     ["rounding", "nearest", "'floor'"]),
    (cq.quantize_groupwise_zero_point, (X,), {"rounding": "stochastic"}, ValueError,
     ["rbits", "seed", "neither"]),
    (cq.quantize_groupwise_zero_point, (X,), {"rounding": "stochastic", "rbits": R, "seed": 1},
     ValueError, ["rbits", "seed", "both"]),
    (cq.quantize_groupwise_zero_point, (X,), {"seed": 1}, ValueError, ["seed", "stochastic"]),
    (cq.quantize_groupwise_zero_point, (X,), {"symmetric": "yes"}, TypeError,
     ["symmetric", "'yes'"]),
    (cq.quantize_groupwise_zero_point, (X,), {"rounding": "stochastic", "rbits": R[:, :128]},
     ValueError, ["rbits", "(4, 256)", "(4, 128)"]),
    (cq.quantize_groupwise_zero_point, (X,), {"rounding": "stochastic", "rbits": R.view(np.int32)},
     TypeError, ["rbits", "uint32", "int32"]),
    (cq.quantize_groupwise_zero_point, (X,), {"rounding": "stochastic", "seed": -1}, ValueError,
     ["seed", "2**64", "-1"]),
    (cq.quantize_groupwise_zero_point, (X,), {"rounding": "stochastic", "seed": 1.5}, TypeError,
     ["seed", "1.5"]),
    (cq.dequantize_groupwise_zero_point, (QZ.view(np.int8), SZ, ZZ, 128, "float16"), {}, TypeError,
     ["q", "uint8", "int8"]),
    (cq.dequantize_groupwise_zero_point, (QZ, SZ.astype(np.float32), ZZ, 128, "float16"), {},
     TypeError, ["scales", "float32"]),
    (cq.dequantize_groupwise_zero_point, (QZ, SZ, ZZ.astype(BF16), 128, "float16"), {}, TypeError,
     ["zeros", "float16", "bfloat16"]),
    (cq.dequantize_groupwise_zero_point, (QZ, SZ, ZZ[:, :1], 128, "float16"), {}, ValueError,
     ["zeros", "(4, 2)", "(4, 1)"]),
    (cq.dequantize_groupwise_zero_point, (QZ[:, :100], SZ, ZZ, 128, "float16"), {}, ValueError,
     ["q", "(4, 128)", "(4, 100)"]),
    (cq.dequantize_groupwise_zero_point, (QZ, SZ, ZZ, 128, "float16"), {"bits": 8}, ValueError,
     ["q", "(4, 256)", "bits=8"]),
    (cq.dequantize_groupwise_zero_point, (QZ, SZ, ZZ, 128, "int4"), {}, TypeError, ["dtype"]),
]


@pytest.mark.parametrize("fn,args,kwargs,exc,words", REFUSALS,
                         ids=[f"{r[0].__name__}-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals(fn, args, kwargs, exc, words):
    assert_refused(fn, args, kwargs, exc, words)
