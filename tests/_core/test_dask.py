"""Dask arrays in, dask arrays out: every declared op on dask arrays cut into uneven chunks
equals the eager call on the whole arrays, bit for bit (NumPy chunks here; CuPy chunks in
the GPU tests). Dask is optional: `pip install cuquant[dask]`."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from _util import assert_same_bits

da = pytest.importorskip("dask.array")

from cuquant import testing  # noqa: E402
from cuquant._core import dask as _dask  # noqa: E402

OPS = [op for op in testing.all_ops() if op.name in _dask.RULES]


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
            assert_same_bits(d.compute(), e, f"{op.name} {shape} output {i}")
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
    import ml_dtypes

    def dev(a):
        if not isinstance(a, np.ndarray):
            return a
        return cp.asarray(a.view(np.uint8) if a.dtype == ml_dtypes.float8_e4m3fn else a)

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
            assert_same_bits(got, e, f"{op.name} {shape} output {i}")
        ran += 1
    assert ran, f"{op.name} {variant}: no test shape taken"
