"""INT8 family on the NumPy backend: golden cases derived by hand, properties, round
trips, empty inputs and refusals (docs/formats.md section 3)."""

import itertools
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cuquant as cq
from _util import assert_refused, assert_same_bits

C127 = np.float32(1) / np.float32(127)  # f32(1/127), the spec's C(1/127)
BF16 = ml_dtypes.bfloat16


# ---------------------------------------------------------------------------------------
# Golden cases: the codes are written out by hand

def test_per_channel_golden():
    w = np.array([[1.0, -2.0, 0.5, 127.0],
                  [0.0, 0.0, 0.0, 0.0],
                  [-0.0, 3.0, -1.5, 0.75]], dtype=np.float32)
    q, s = cq.quantize_int8_per_channel(w)
    # Row 0: amax 127 -> scale 127 * C = 1.0 exactly; 0.5 is a tie -> 0 (even).
    # Row 1: all zero -> scale 1.0, codes 0.
    # Row 2: scale = f32(3 * C); -1.5 / scale = -63.5000002 exactly, which float32 division
    #        rounds to -63.5, a tie -> -64 (even). 0.75 / scale = 31.75... -> 32.
    assert q.tolist() == [[1, -2, 0, 127], [0, 0, 0, 0], [0, 127, -64, 32]]
    assert_same_bits(s, np.array([1.0, 1.0, np.float32(3) * C127], dtype=np.float32))


def test_static_scale_ties_and_specials():
    x = np.array([0.25, 0.75, 1.25, -0.25, -0.75, 63.75, 64.0, -100.0, np.nan, np.inf, -np.inf,
                  1e-45], dtype=np.float32)
    q, s = cq.quantize_int8_per_tensor(x.reshape(3, 4), scale=0.5)
    # x / 0.5 = .5, 1.5, 2.5, -.5, -1.5, 127.5, 128, -200, nan, inf, -inf, 2e-45
    assert q.reshape(-1).tolist() == [0, 2, 2, 0, -2, 127, 127, -127, 0, 127, -127, 0]
    assert s.tolist() == [0.5]


def test_per_tensor_nan_and_inf_reach_the_scale():
    x = np.array([[1.0, np.nan], [2.0, 3.0]], dtype=np.float32)
    q, s = cq.quantize_int8_per_tensor(x)
    assert s.view(np.uint32)[0] == 0x7FFFFFFF  # canonical NaN
    assert q.tolist() == [[0, 0], [0, 0]]  # every quotient is NaN
    x = np.array([[1.0, np.inf], [-2.0, 0.0]], dtype=np.float32)
    q, s = cq.quantize_int8_per_tensor(x)
    assert s.tolist() == [np.inf]
    assert q.tolist() == [[0, 0], [0, 0]]  # finite / inf = 0; inf / inf = NaN -> 0


def test_subnormal_scale_is_honoured():
    # An all-subnormal row; in units of 2**-149 the inputs are 71362 and -35681, the
    # scale RN(71362 * C) = 562 (subnormal too), so the codes are 71362/562 = 126.98 -> 127
    # and -35681/562 = -63.49 -> -63. Flushing anything to zero would give other codes.
    tiny = np.float32(2.0 ** -149)
    w = np.array([[71362 * tiny, -35681 * tiny, 0.0]], dtype=np.float32)
    q, s = cq.quantize_int8_per_channel(w)
    assert s[0] == 562 * tiny
    assert q.tolist() == [[127, -63, 0]]


def test_scale_that_rounds_to_zero():
    w = np.array([[2.0 ** -149, 0.0, -(2.0 ** -149)]], dtype=np.float32)
    q, s = cq.quantize_int8_per_channel(w)
    # amax * C rounds to 0 and is raised to 2**-149: codes 1, 0, -1 (a zero scale would
    # give +-127 for +-inf quotients)
    assert s.tolist() == [2.0 ** -149]
    assert q.tolist() == [[1, 0, -1]]


def test_per_block_golden():
    x = np.zeros((2, 70), dtype=np.float32)
    x[0, :3] = [127.0, 63.5, -1.0]
    x[0, 64] = -254.0      # second block of row 0 (elements 64..69)
    x[0, 65] = 127.0
    x[1, 66] = 5.0
    q, s = cq.quantize_int8_per_block(x, block_size=64)
    assert s.shape == (2, 2)
    assert s.tolist()[0] == [1.0, np.float32(254) * C127]
    assert s.tolist()[1] == [1.0, np.float32(5) * C127]
    assert q[0, :3].tolist() == [127, 64, -1]  # 63.5 is a tie -> 64
    assert q[0, 64:66].tolist() == [-127, 64]  # 127 / (254 C) = 63.5000002 -> 63.5 -> 64
    assert q[1, 66] == 127 and np.count_nonzero(q) == 6


def test_smooth_quant_golden():
    x = np.array([[2.0, -4.0, 1.0], [0.0, 0.0, 0.0]], dtype=np.float16)
    smooth = np.array([2.0, 0.5, 0.0], dtype=np.float32)
    q, s = cq.smooth_quant(x[:1, :2], smooth[:2])
    # xs = [1, -8]; scale = 8 C; codes 1 / (8 C) = 15.875 -> 16, -127.
    assert q.tolist() == [[16, -127]]
    assert s.tolist() == [np.float32(8) * C127]
    q, s = cq.smooth_quant(x, smooth)
    # A zero smoothing factor: row 0 has xs = [1, -8, inf], so its scale is inf and every
    # code 0 (finite / inf = 0, inf / inf = NaN -> 0); row 1 has 0 / 0 = NaN, so a NaN scale.
    assert s[0] == np.inf and s.view(np.uint32)[1] == 0x7FFFFFFF
    assert q.tolist() == [[0, 0, 0], [0, 0, 0]]


def test_dequantize_golden():
    q = np.array([[-127, 0, 1, 127]], dtype=np.int8)
    s = np.array([0.5], dtype=np.float32)
    for name, want in [("float32", [-63.5, 0, 0.5, 63.5]), ("float16", [-63.5, 0, 0.5, 63.5])]:
        assert cq.dequantize_int8_per_tensor(q, s, name).tolist() == [want]
    # float32 product, then one rounding to bfloat16: 127 * 0.1 = 12.7 -> 12.6875 in bf16
    out = cq.dequantize_int8_per_channel(q, np.array([np.float32(0.1)]), "bfloat16")
    assert out.dtype == BF16
    assert out.astype(np.float32).tolist() == [[-12.6875, 0.0, 0.10009765625, 12.6875]]


def test_dequantize_nan_scale_is_canonical():
    q = np.array([[1, 2]], dtype=np.int8)
    out = cq.dequantize_int8_per_channel(q, np.array([np.nan], np.float32), np.float16)
    assert out.view(np.uint16).tolist() == [[0x7FFF, 0x7FFF]]


# ---------------------------------------------------------------------------------------
# Properties

finite = st.floats(-3e4, 3e4, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=40), elements=finite))
def test_per_channel_error_bound_and_sign_symmetry(w):
    q, s = cq.quantize_int8_per_channel(w)
    assert q.dtype == np.int8 and np.all(np.abs(q.astype(np.int32)) <= 127)
    amax = np.max(np.abs(w), axis=1, initial=0)
    # amax * C(1/127), raised to 2**-149 where that rounds to 0, and 1 for amax 0
    want = np.maximum((amax * C127).astype(np.float32), np.float32(2.0 ** -149))
    np.testing.assert_array_equal(s, np.where(amax == 0, np.float32(1), want))
    err = np.abs(q.astype(np.float64) * s[:, None] - w)
    # The bound needs a normal scale: a subnormal one has too few bits for amax / scale to
    # stay within the clamp (the golden cases below pin those rows down exactly).
    ok = s >= np.finfo(np.float32).tiny
    assert np.all(err[ok] <= s[ok, None].astype(np.float64) * (0.5 + 1e-6) + 1e-45)
    qn, sn = cq.quantize_int8_per_channel(-w)
    np.testing.assert_array_equal(qn, -q)
    np.testing.assert_array_equal(sn, s)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=300), elements=finite),
       st.sampled_from([32, 64, 128, 256]))
def test_per_block_equals_per_channel_on_each_block(x, bs):
    q, s = cq.quantize_int8_per_block(x, block_size=bs)
    for j in range(s.shape[1]):
        qb, sb = cq.quantize_int8_per_channel(x[:, j * bs:(j + 1) * bs])
        np.testing.assert_array_equal(q[:, j * bs:(j + 1) * bs], qb)
        np.testing.assert_array_equal(s[:, j], sb)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=20), elements=finite))
def test_per_tensor_is_per_channel_of_the_flattened_tensor(x):
    q, s = cq.quantize_int8_per_tensor(x)
    qc, sc = cq.quantize_int8_per_channel(x.reshape(1, -1))
    np.testing.assert_array_equal(q.reshape(-1), qc.reshape(-1))
    np.testing.assert_array_equal(s, sc)


def test_round_trip_bf16_numpy(rng):
    x = (rng.standard_normal((64, 512)) * 3).astype(BF16)
    x32 = x.astype(np.float32)
    q, s = cq.quantize_int8_per_channel(x)
    back = cq.dequantize_int8_per_channel(q, s, BF16)
    assert back.dtype == BF16 and back.shape == x.shape
    # half a step of quantization, then half a bf16 ulp of rounding the result
    bound = s[:, None] * 0.5 + np.abs(x32) * 2.0 ** -8
    assert np.all(np.abs(back.astype(np.float32) - x32) <= bound)
    q, s = cq.quantize_int8_per_block(x, block_size=128)
    back = cq.dequantize_int8_per_block(q, s, BF16, block_size=128)
    bound = np.repeat(s, 128, axis=1) * 0.5 + np.abs(x32) * 2.0 ** -8
    assert np.all(np.abs(back.astype(np.float32) - x32) <= bound)


@pytest.mark.parametrize("shape", [(0, 16), (16, 0), (0, 0)])
def test_empty_inputs(shape):
    x = np.zeros(shape, dtype=np.float16)
    q, s = cq.quantize_int8_per_channel(x)
    assert q.shape == shape and s.shape == (shape[0],) and np.all(s == 1)
    q, s = cq.quantize_int8_per_block(x)
    assert q.shape == shape and s.shape == (shape[0], -(-shape[1] // 128))
    q, s = cq.quantize_int8_per_tensor(x)
    assert q.shape == shape and s.tolist() == [1.0]
    out = cq.dequantize_int8_per_channel(q, np.ones(shape[0], np.float32), np.float32)
    assert out.shape == shape and out.dtype == np.float32


# ---------------------------------------------------------------------------------------
# Refusals: the message names the function, the argument, the expectation and the value

X = np.ones((4, 256), dtype=np.float16)
Q = np.ones((4, 256), dtype=np.int8)

REFUSALS = [
    (cq.quantize_int8_per_channel, (X.astype(np.float64),), {}, TypeError, ["w", "float64"]),
    (cq.quantize_int8_per_channel, (X[0],), {}, ValueError, ["w", "2-D", "(256,)"]),
    (cq.quantize_int8_per_channel, ([[1.0]],), {}, TypeError, ["w", "list"]),
    (cq.quantize_int8_per_block, (X,), {"block_size": 100}, ValueError, ["block_size", "100"]),
    (cq.quantize_int8_per_block, (X,), {"block_size": 12.5}, TypeError, ["block_size"]),
    (cq.quantize_int8_per_block, (X[None],), {}, ValueError, ["x", "(1, 4, 256)"]),
    (cq.quantize_int8_per_tensor, (X,), {"scale": 0.0}, ValueError, ["scale", "> 0"]),
    (cq.quantize_int8_per_tensor, (X,), {"scale": float("nan")}, ValueError, ["scale"]),
    (cq.quantize_int8_per_tensor, (X,), {"scale": np.ones(2, np.float32)}, ValueError,
     ["scale", "(2,)"]),
    (cq.quantize_int8_per_tensor, (X,), {"scale": np.ones(1, np.float16)}, TypeError,
     ["scale", "float16"]),
    (cq.quantize_int8_per_tensor, (X,), {"scale": "1"}, TypeError, ["scale", "str"]),
    (cq.quantize_int8_per_tensor, (X,), {"scale": True}, TypeError,
     ["scale", "number or a float32 array", "True"]),
    (cq.smooth_quant, (X, np.ones(255, np.float32)), {}, ValueError, ["smooth", "(255,)"]),
    (cq.smooth_quant, (X, np.ones(256, np.float16)), {}, TypeError, ["smooth", "float16"]),
    (cq.dequantize_int8_per_channel, (Q.astype(np.uint8), np.ones(4, np.float32), np.float16),
     {}, TypeError, ["q", "int8", "uint8"]),
    (cq.dequantize_int8_per_channel, (Q, np.ones(3, np.float32), np.float16), {}, ValueError,
     ["scale", "(4,)", "(3,)"]),
    (cq.dequantize_int8_per_channel, (Q, np.ones(4, np.float32), np.int32), {}, TypeError,
     ["dtype", "int32"]),
    (cq.dequantize_int8_per_block, (Q, np.ones((4, 3), np.float32), "float32"), {}, ValueError,
     ["scale", "(4, 2)", "(4, 3)"]),
    (cq.dequantize_int8_per_tensor, (Q, np.ones(2, np.float32), "float32"), {}, ValueError,
     ["scale", "one value"]),
    (cq.dequantize_int8_per_tensor, (Q, np.ones(1, np.float32), "float32"), {"stream": "s"},
     TypeError, ["stream"]),
]


@pytest.mark.parametrize("fn,args,kwargs,exc,words", REFUSALS,
                         ids=[f"{r[0].__name__}-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals(fn, args, kwargs, exc, words):
    assert_refused(fn, args, kwargs, exc, words)


# ---------------------------------------------------------------------------------------
# The row kernels' geometries (shared by the INT8 and FP8 row quantizers)

@pytest.mark.parametrize("exact_teams", [True, False],
                         ids=["whole-warp teams", "power-of-two teams"])
def test_row_geometries_hold_their_groups(exact_teams):
    from cuquant._cuda import symmetric as _symmetric

    listed = set(_symmetric.geometries(exact_teams))
    for nvec in range(1, 4200):
        tpg, vpt = _symmetric.geometry(nvec, exact_teams)
        assert (tpg, vpt) in listed, nvec  # compiled by the compile check
        if vpt:
            assert tpg * vpt >= nvec, nvec  # the team holds the whole group
        if tpg > 32:
            assert tpg % 32 == 0, nvec  # whole warps: the reduction shuffles full warps
        threads = _symmetric.row_threads(tpg)
        assert threads % tpg == 0 and threads <= 1024, nvec
        if exact_teams and 128 < nvec <= 1024:
            assert tpg * vpt - nvec < 128, nvec  # less than one warp's vectors left empty


def test_smooth_rows_kernel_is_listed_and_fits():
    # SmoothQuant rows of 16-byte vectors that a team holds take smooth_quant_rows where
    # its shared memory (K reciprocals, K factors and the next row) fits a block: on an
    # H100 / H200 (227 KB) every row of up to 16384 elements does.
    from cuquant._cuda import symmetric as _symmetric
    from cuquant._core.dtypes import FLOATS

    listed = {e for _, e in _symmetric.specializations()}
    for t in FLOATS.values():
        vec = t.vector_width
        for nvec, wide in itertools.product(range(1, 4097), (True, False)):
            geom = _symmetric.smooth_geometry(nvec, wide)
            full = _symmetric.smooth_full(nvec * vec, vec, geom)
            assert _symmetric.smooth_expr(t, vec, geom, full) in listed, (t.name, nvec, wide)
            tpg, vpt = geom
            assert full == (tpg >= 32 and nvec == tpg * vpt), nvec
            assert tpg * vpt >= nvec, nvec  # the team holds the whole row
            if wide and nvec > 128:  # 4-7 vectors a thread: fewer than a thread's worth empty
                assert 4 <= vpt <= 7 and tpg * (vpt - 1) < nvec, nvec
            threads = _symmetric.smooth_threads(tpg, vpt)
            assert threads % tpg == 0 and (tpg <= 32 or tpg % 32 == 0), nvec
            if nvec * vec <= 16384:
                assert _symmetric.smooth_shared_bytes(nvec * vec, threads, geom) <= 227 * 1024


def test_plan_tables_are_bounded(monkeypatch):
    # A server meeting ever new shapes must not grow the launch-plan tables without end.
    from cuquant._cuda import launch as _gpu

    monkeypatch.setattr(_gpu, "PLAN_LIMIT", 3)
    table: dict = {}
    for i in range(7):
        assert _gpu.remember(table, i, str(i)) == str(i)
        assert len(table) <= 3 and table[i] == str(i)
