"""Dask arrays in, dask arrays out: every declared op on dask arrays cut into uneven chunks
equals the eager call on the whole arrays, bit for bit (NumPy chunks here; CuPy chunks in
the GPU tests). Dask is optional: `pip install cuquant[dask]`."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from _util import assert_same_bits

da = pytest.importorskip("dask.array")

import op_table  # noqa: E402
from cuquant._core import dask as _dask  # noqa: E402

OPS = [op for op in op_table.all_ops() if op.name in _dask.RULES]


def _uneven(a: np.ndarray):
    """A dask array of `a` in chunks of about a third of each axis (never aligned to a
    group, a row run or a tile)."""
    chunks = tuple(max(1, (s + 2) // 3 + 1) for s in a.shape)
    return da.from_array(a, chunks=chunks)


def _to_dask(v):
    if isinstance(v, np.ndarray) and v.ndim >= 1 and v.size > 1:
        return _uneven(v)
    return v


def _cases():
    for op in OPS:
        for variant in op.variants:
            yield pytest.param(op, variant, id=f"{op.name}-{op.notes}-{variant}")


@pytest.mark.parametrize("op,variant", list(_cases()))
def test_dask_equals_eager(op, variant, rng):
    """Every test shape of the op that the variant takes (a group size must divide K)."""
    dtype = "bfloat16" if "bfloat16" in op.dtypes else op.dtypes[0]
    ran = 0
    for shape in (s for s in op.shapes if 0 < int(np.prod(s)) <= 1 << 18):
        args, kwargs = op.make(np, rng, shape, dtype, **variant)
        try:
            eager = op.fn(*args, **kwargs)
        except ValueError:
            continue  # the variant does not take this shape, eagerly either
        lazy = op.fn(_uneven(args[0]), *[_to_dask(a) for a in args[1:]],
                     **{k: _to_dask(v) for k, v in kwargs.items()})
        eager = eager if isinstance(eager, tuple) else (eager,)
        lazy = lazy if isinstance(lazy, tuple) else (lazy,)
        assert len(eager) == len(lazy)
        for i, (e, d) in enumerate(zip(eager, lazy)):
            assert isinstance(d, da.Array), f"output {i} is not a dask array"
            got = d.compute()
            assert d.dtype == got.dtype == e.dtype, f"{op.name} output {i}: {d.dtype}, {e.dtype}"
            assert_same_bits(got, e, f"{op.name} {shape} output {i}")
        ran += 1
    assert ran, f"{op.name} {variant}: no test shape taken"


def test_dynamic_per_tensor_scale_of_nan_and_inf(rng):
    """The per-tensor scale is reduced over every chunk: a NaN in one chunk makes it NaN
    (every code 0) as in the eager call, an inf makes it inf."""
    import cuquant as cq

    x = rng.standard_normal((40, 64)).astype(np.float32)
    for bad in (np.nan, np.inf):
        x[37, 5] = bad
        for fn in (cq.quantize_int8_per_tensor, cq.quantize_fp8_per_tensor):
            q, s = fn(_uneven(x))
            qe, se = fn(x)
            assert_same_bits(s.compute(), se, fn.__name__)
            assert_same_bits(q.compute(), qe, fn.__name__)


def test_seeded_rounding_takes_each_chunks_own_words(rng):
    import cuquant as cq

    x = rng.standard_normal((20, 256)).astype(np.float16)
    eager = cq.quantize_groupwise_zero_point(x, 4, 128, rounding="stochastic", seed=12345)
    lazy = cq.quantize_groupwise_zero_point(_uneven(x), 4, 128, rounding="stochastic", seed=12345)
    for e, d in zip(eager, lazy):
        assert_same_bits(d.compute(), e)


def test_on_a_local_cluster(rng):
    """The same results when the chunks run in worker processes of a LocalCluster (the ops
    travel to the workers by name, the chunks by pickling)."""
    distributed = pytest.importorskip("distributed")
    import cuquant as cq

    x = rng.standard_normal((300, 512)).astype(np.float32)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        for fn in (cq.quantize_int8_per_channel, cq.quantize_fp8_per_block,
                   cq.quantize_int8_per_tensor):
            lazy = fn(_uneven(x))
            for e, d in zip(fn(x), lazy):
                assert_same_bits(d.compute(), e, fn.__name__)


def test_refusals():
    import cuquant as cq

    x = _uneven(np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match="stream= does not apply to dask arrays"):
        cq.quantize_int8_per_channel(x, stream=0)


# ---------------------------------------------------------------------------------------
# Microscaling formats: rows (or runs of 128-row tiles for swizzled scales), NVFP4's tensor
# amax reduced first, seeded words by element index

def _mx_quantizers():
    import cuquant as cq

    yield cq.quantize_mxfp8, {"scale_mode": "rceil"}
    yield cq.quantize_mxfp8, {"scale_mode": "floor"}
    yield cq.quantize_mxfp4, {"scale_mode": "floor"}
    yield cq.quantize_mxfp4, {"rounding": "stochastic", "seed": 2 ** 63 + 12345}
    yield cq.quantize_mxfp4, {"rounding": "stochastic", "rbits": True}
    yield cq.quantize_nvfp4, {}
    yield cq.quantize_nvfp4, {"global_amax": 3.0}
    yield cq.quantize_nvfp4, {"global_amax": np.array([0.75], np.float32)}
    yield cq.quantize_nvfp4, {"rounding": "stochastic", "seed": 7}
    yield cq.quantize_nvfp4, {"rounding": "stochastic", "seed": 7, "global_amax": 2.5}
    yield cq.quantize_nvfp4, {"rounding": "stochastic", "rbits": True}


def _dequantizer(quantize):
    import cuquant as cq

    return {cq.quantize_mxfp8: cq.dequantize_mxfp8, cq.quantize_mxfp4: cq.dequantize_mxfp4,
            cq.quantize_nvfp4: cq.dequantize_nvfp4}[quantize]


def _equal(lazy, eager, what):
    """A dask array whose dtype and bits are the eager result's."""
    assert isinstance(lazy, da.Array), f"{what}: not a dask array"
    got = lazy.compute()
    assert lazy.dtype == got.dtype == eager.dtype, f"{what}: {lazy.dtype} {got.dtype} {eager.dtype}"
    assert_same_bits(got, eager, what)


def _ragged(a, rows):
    """A dask array of `a` in chunks of `rows` rows (a 1-D array: about a third) and columns
    of about a third."""
    if a.ndim == 1:
        return da.from_array(a, chunks=max(1, a.shape[0] // 3 + 5))
    return da.from_array(a, chunks=(rows, max(1, a.shape[1] // 3 + 1)))


def _mx_round_trip(fn, kw, x, rows, rng, what):
    """The quantizer on x in chunks of `rows` rows, then its dequantizer on the lazy outputs
    and on eager outputs cut raggedly: each equal to the eager call."""
    kw = dict(kw)
    if kw.get("rbits") is True:
        kw["rbits"] = rng.integers(0, 1 << 32, size=x.shape, dtype=np.uint32)
    eager = fn(x, **kw)
    lazy_kw = {k: (_ragged(v, max(1, rows // 2 + 3)) if k == "rbits" else v) for k, v in kw.items()}
    lazy = fn(_ragged(x, rows), **lazy_kw)
    assert len(lazy) == len(eager)
    for i, (d, e) in enumerate(zip(lazy, eager)):
        _equal(d, e, f"{what} output {i}")
    deq = _dequantizer(fn)
    for out in ("float32", "bfloat16"):
        want = deq(*eager, out)
        _equal(deq(*lazy, out), want, f"{what} dequantized lazily")
        cut = tuple(e if e.shape == (1,) else _ragged(e, rows + 1) for e in eager)
        _equal(deq(*cut, out), want, f"{what} dequantized from chunks")
    return eager


@pytest.mark.parametrize("layout", ["row", "swizzled"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_microscaling_ragged_chunks_equal_eager(layout, dtype, rng):
    """Row chunks that are not multiples of 128 (one row, a few rows, fewer than a tile, a
    tile and one, more than a tile) over shapes whose last tile is partial and whose scale columns are
    padded in the swizzled layout (C = 3, 5, 6, 10)."""
    import ml_dtypes

    t = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    for fn, kw in _mx_quantizers():
        for m, k in ((300, 160), (130, 96), (1, 96), (13, 32)):
            x = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-6, 6, (m, 1)))).astype(t)
            for rows in ((1, 3) if m < 20 else (50, 129, 200, m)):
                _mx_round_trip(fn, dict(kw, scale_layout=layout), x, rows, rng,
                               f"{fn.__name__} {kw} {layout} {dtype} {(m, k)} rows {rows}")


def test_microscaling_swizzled_chunks_are_tile_runs(rng):
    """Swizzled scales of a dask array come in runs of whole 128-row tiles, each chunk's
    bytes the next slice of the whole array's, padding rows from the last chunk only."""
    import cuquant as cq

    x = rng.standard_normal((300, 96)).astype(np.float32)
    q, s = cq.quantize_mxfp8(_ragged(x, 100), scale_layout="swizzled")
    c_pad = 4   # C = 3 scale columns, padded to 4
    assert q.chunks[0] == (128, 128, 44)
    assert s.chunks == ((128 * c_pad, 128 * c_pad, 128 * c_pad),)
    assert_same_bits(s.compute(), cq.quantize_mxfp8(x, scale_layout="swizzled")[1])


def test_seeded_fp4_rounding_takes_each_chunks_own_words(rng):
    """seed= of the fp4 formats: each chunk draws its own elements' words, so any chunking
    gives the eager codes; another seed gives other codes (the words matter)."""
    import cuquant as cq

    x = rng.standard_normal((260, 64)).astype(np.float32)
    for fn in (cq.quantize_mxfp4, cq.quantize_nvfp4):
        eager = fn(x, rounding="stochastic", seed=99)
        assert not np.array_equal(eager[0], fn(x, rounding="stochastic", seed=100)[0])
        assert not np.array_equal(eager[0], fn(x)[0])
        for layout in ("row", "swizzled"):
            eager = fn(x, scale_layout=layout, rounding="stochastic", seed=99)
            for rows in (3, 77, 128, 259):
                lazy = fn(_ragged(x, rows), scale_layout=layout, rounding="stochastic", seed=99)
                for i, (d, e) in enumerate(zip(lazy, eager)):
                    _equal(d, e, f"{fn.__name__} {layout} rows {rows} output {i}")


def _bits32(v: int) -> np.float32:
    return np.array([v], np.uint32).view(np.float32)[0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_microscaling_nan_and_inf_in_a_block(dtype, rng):
    """A NaN (negative, with a payload) or an infinity in one block of one chunk: the
    block's scales and codes as eagerly; NVFP4's tensor amax, reduced over the chunks, is
    NaN (the canonical 0x7FFFFFFF) or inf, and every chunk is quantized against it, as
    eagerly; a given global amax confines them to their block. An all-zero tensor has
    amax 0."""
    import ml_dtypes

    import cuquant as cq

    t = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    base = rng.standard_normal((290, 64)).astype(np.float32)
    bad_nan = _bits32(0xFFC00123)
    cases = []
    for bad in (bad_nan, np.float32(np.inf), np.float32(-np.inf)):
        x = base.copy()
        x[201, 37] = bad
        cases.append(x.astype(t))
    cases.append(np.zeros((290, 64), t))
    for x in cases:
        for layout in ("row", "swizzled"):
            for fn, kw in ((cq.quantize_mxfp8, {}), (cq.quantize_mxfp4, {}),
                           (cq.quantize_mxfp4, {"rounding": "stochastic", "seed": 5}),
                           (cq.quantize_nvfp4, {}), (cq.quantize_nvfp4, {"global_amax": 4.0}),
                           (cq.quantize_nvfp4, {"rounding": "stochastic", "seed": 5})):
                eager = _mx_round_trip(fn, dict(kw, scale_layout=layout), x, 70, rng,
                                       f"{fn.__name__} {kw} {layout}")
                if fn is cq.quantize_nvfp4 and not kw and x.any():
                    a = eager[2].view(np.uint32)[0]
                    assert a in (0x7FFFFFFF, 0x7F800000), hex(a)   # NaN canonical, or inf
    # a NaN in only one chunk reaches every chunk's scales, as eagerly
    lazy = cq.quantize_nvfp4(_ragged(cases[0], 70))
    assert (lazy[1].compute().view(np.uint8) == 0x7F).all()


def test_microscaling_empty(rng):
    x = np.zeros((0, 64), np.float32)
    for fn, kw in _mx_quantizers():
        for layout in ("row", "swizzled"):
            _mx_round_trip(fn, dict(kw, scale_layout=layout), x, 4, rng, f"{fn.__name__} empty")


def test_microscaling_refusals_are_the_ops_own(rng):
    """Arguments the eager call refuses are refused when the dask call is made."""
    import cuquant as cq

    x = rng.standard_normal((200, 64)).astype(np.float32)
    d = _ragged(x, 70)
    calls = [
        (cq.quantize_mxfp4, (x,), {"seed": 3}),                       # seed with nearest
        (cq.quantize_mxfp4, (x,), {"rounding": "stochastic"}),        # neither words nor seed
        (cq.quantize_nvfp4, (x,), {"rounding": "stochastic", "seed": 1,
                                   "rbits": np.zeros(x.shape, np.uint32)}),
        (cq.quantize_nvfp4, (x,), {"global_amax": -1.0}),
        (cq.quantize_nvfp4, (x,), {"global_amax": float("nan")}),
        (cq.quantize_nvfp4, (x,), {"global_amax": np.array([1.0, 2.0], np.float32)}),
        (cq.quantize_mxfp8, (x,), {"scale_layout": "tiled"}),
        (cq.quantize_mxfp8, (x[:, :48],), {}),                        # K not a multiple of 32
        (cq.quantize_mxfp4, (x,), {"rounding": "stochastic",
                                   "rbits": np.zeros((200, 32), np.uint32)}),
    ]
    for fn, args, kw in calls:
        with pytest.raises((TypeError, ValueError)) as eager:
            fn(*args, **kw)
        lazy_kw = {k: (_ragged(v, 70) if isinstance(v, np.ndarray) and v.ndim == 2 else v)
                   for k, v in kw.items()}
        with pytest.raises(eager.type, match=re.escape(str(eager.value).split(" must")[0])):
            fn(_ragged(args[0], 70), **lazy_kw)
    q, s = cq.quantize_mxfp4(x, scale_layout="swizzled")
    for scales in (s[:-1], s[:256 * 2]):                              # not the tiles of q
        with pytest.raises(ValueError, match="dequantize_mxfp4: scales"):
            cq.dequantize_mxfp4(_ragged(q, 70), _ragged(scales, 70), "float32")
    with pytest.raises(ValueError, match="dequantize_mxfp4: scales"):
        cq.dequantize_mxfp4(_ragged(q, 70), _ragged(cq.quantize_mxfp4(x[:100])[1], 70), "float32")
    with pytest.raises(ValueError, match="quantize_nvfp4: x must be a 2-D array"):
        cq.quantize_nvfp4(da.from_array(np.zeros((2, 3, 64), np.float32), chunks=(1, 2, 64)))
    with pytest.raises(ValueError, match="quantize_fp8_per_block: w must be a 2-D array"):
        cq.quantize_fp8_per_block(da.from_array(np.zeros((2, 3, 64), np.float32), chunks=(1, 2, 64)))
    with pytest.raises(ValueError, match="stream= does not apply to dask arrays"):
        cq.quantize_mxfp8(d, stream=0)


def test_unlisted_ops_refuse_dask_arrays():
    import cuquant as cq

    x = _uneven(np.ones((4, 8), np.float32))
    unlisted = [n for n in ("dequantize_groupwise_batched",) if n not in _dask.RULES]
    assert unlisted
    with pytest.raises(TypeError, match="dask arrays are not taken by this function"):
        _dask.call(cq.dequantize_groupwise_batched, unlisted[0], (x, "float16"), {})


def test_import_cuquant_does_not_import_dask():
    code = "import sys, cuquant; print('dask' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
@pytest.mark.parametrize("op,variant", list(_cases()))
def test_dask_cupy_chunks_equal_eager(op, variant, rng):
    """CuPy chunks: each runs on the GPU; the result equals the eager call on the whole
    CuPy array."""
    import cupy as cp

    def dev(a):
        if not isinstance(a, np.ndarray):
            return a
        return cp.asarray(a.view(np.uint8) if a.dtype.name.startswith("float8") else a)

    def dev_dask(a):
        a = dev(a)
        if isinstance(a, cp.ndarray) and a.ndim >= 1 and a.size > 1:
            return da.from_array(a, chunks=tuple(max(1, (s + 2) // 3 + 1) for s in a.shape),
                                 asarray=False)
        return a

    dtype = "bfloat16" if "bfloat16" in op.dtypes else op.dtypes[0]
    ran = 0
    for shape in (s for s in op.shapes if 0 < int(np.prod(s)) <= 1 << 18):
        args, kwargs = op.make(np, rng, shape, dtype, **variant)
        try:
            eager = op.fn(*[dev(a) for a in args], **{k: dev(v) for k, v in kwargs.items()})
        except ValueError:
            continue
        x = dev(args[0])
        lazy = op.fn(da.from_array(x, chunks=tuple(max(1, (s + 2) // 3 + 1) for s in x.shape),
                                   asarray=False),
                     *[dev_dask(a) for a in args[1:]], **{k: dev_dask(v) for k, v in kwargs.items()})
        eager = eager if isinstance(eager, tuple) else (eager,)
        lazy = lazy if isinstance(lazy, tuple) else (lazy,)
        for i, (e, d) in enumerate(zip(eager, lazy)):
            got = d.compute()
            assert isinstance(got, cp.ndarray), f"output {i} left the GPU"
            assert d.dtype == got.dtype == e.dtype, f"{op.name} output {i}: {d.dtype}, {e.dtype}"
            assert_same_bits(got, e, f"{op.name} {shape} output {i}")
        ran += 1
    assert ran, f"{op.name} {variant}: no test shape taken"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_microscaling_cupy_chunks_nan_inf_and_device_amax(dtype, rng):
    """CuPy chunks of the microscaling formats: a NaN or an infinity in one block of one
    chunk, NVFP4's tensor amax reduced over the chunks on the GPU, a global amax given on
    the device, seeded words, both layouts, ragged chunks: equal to the eager call on the
    whole CuPy array."""
    import cupy as cp
    import ml_dtypes

    import cuquant as cq

    t = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    base = rng.standard_normal((300, 160)).astype(np.float32)
    xs = []
    for bad in (None, _bits32(0xFFC00123), np.float32(np.inf)):
        x = base.copy()
        if bad is not None:
            x[201, 37] = bad
        xs.append(cp.asarray(x.astype(t)))
    xs.append(cp.zeros((300, 160), t))
    device_amax = cp.asarray(np.array([2.0], np.float32))
    for x in xs:
        for layout in ("row", "swizzled"):
            for fn, kw in ((cq.quantize_mxfp8, {}), (cq.quantize_mxfp4, {}),
                           (cq.quantize_mxfp4, {"rounding": "stochastic", "seed": 11}),
                           (cq.quantize_nvfp4, {}),
                           (cq.quantize_nvfp4, {"global_amax": device_amax}),
                           (cq.quantize_nvfp4, {"rounding": "stochastic", "seed": 11})):
                kw = dict(kw, scale_layout=layout)
                eager = fn(x, **kw)
                for rows in (7, 129, 300):
                    lazy = fn(da.from_array(x, chunks=(rows, 55), asarray=False), **kw)
                    for i, (d, e) in enumerate(zip(lazy, eager)):
                        got = d.compute()
                        assert isinstance(got, cp.ndarray), f"output {i} left the GPU"
                        assert d.dtype == got.dtype == e.dtype
                        assert_same_bits(got, e, f"{fn.__name__} {kw} rows {rows} output {i}")
                    deq = _dequantizer(fn)
                    back = deq(*lazy, "bfloat16").compute()
                    assert isinstance(back, cp.ndarray)
                    assert_same_bits(back, deq(*eager, "bfloat16"), f"{fn.__name__} dequantized")
