"""The op declarations that the tests and the benchmark both read: each names a public
function, and each baseline accepts the arguments the benchmark passes to it (a baseline
that raised would only leave its column of the benchmark table empty)."""

import inspect

import numpy as np
import pytest

import cuquant
import op_table

from benchmarks import harness
from benchmarks.__main__ import _bench_dtype

OPS = op_table.all_ops()


@pytest.mark.parametrize("op", OPS, ids=[o.name + (f"-{o.notes}" if o.notes else "") for o in OPS])
def test_declaration_names_a_public_function(op):
    assert op.name in cuquant.__all__ and callable(op.fn)


def test_every_public_op_is_declared():
    """The converse: an op left out of the table would be neither GPU-tested nor
    benchmarked."""
    ops = {name for name in cuquant.__all__ if inspect.isfunction(getattr(cuquant, name))}
    assert ops == op_table.declared_names()


@pytest.mark.parametrize("op", [o for o in OPS if o.torch_ref or o.cupy_ref],
                         ids=lambda o: o.name + (f"-{o.notes}" if o.notes else ""))
def test_baselines_accept_the_benchmark_arguments(op):
    rng = np.random.default_rng(0)
    shape = op.bench_shapes[0]
    for variant in op.bench_variants:
        args, kwargs = op.make(np, rng, shape, _bench_dtype(op, ""), **variant)
        for ref in (op.torch_ref, op.cupy_ref):
            if ref is not None:
                inspect.signature(ref).bind(*args, **kwargs)


@pytest.mark.parametrize("op", [o for o in OPS if o.torch_ref],
                         ids=lambda o: o.name + (f"-{o.notes}" if o.notes else ""))
def test_torch_baselines_run_at_the_small_benchmark_shapes(op):
    torch = pytest.importorskip("torch")  # CPU tensors of the NumPy arguments
    rng = np.random.default_rng(0)
    shapes = [s for s in op.bench_shapes if s in op_table.SMALL_SHAPES] or list(op.bench_shapes[:1])
    for variant in op.bench_variants:
        for shape in shapes:
            args, kwargs = op.make(np, rng, shape, _bench_dtype(op, ""), **variant)
            with torch.no_grad():
                op.torch_ref(*harness.to_torch(list(args)), **kwargs)
