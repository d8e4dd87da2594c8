"""JAX on the CPU: every op inside jax.jit (a buffer callback through the NumPy backend)
giving the bits of the eager call, with the eager call's shapes and dtypes."""

from __future__ import annotations

import numpy as np
import pytest

import cuquant as cq
import op_table
from _util import assert_same_bits, op_variant_cases

jax = pytest.importorskip("jax")
from _jit_args import flat, unflat  # noqa: E402 - needs jax
jnp = jax.numpy

OPS = list(op_table.all_ops())
CASES = op_variant_cases(OPS)
SHAPE = (16, 512)


def _as_jax(v):
    if isinstance(v, np.ndarray):
        return jnp.asarray(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_as_jax(e) for e in v)
    return v


def _same(a, b):
    a = list(a) if isinstance(a, (tuple, list)) else [a]
    b = list(b) if isinstance(b, (tuple, list)) else [b]
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert isinstance(x, jax.Array) and isinstance(y, jax.Array)
        assert x.dtype == y.dtype
        assert_same_bits(x, y)


@pytest.mark.parametrize("op, variant", CASES)
def test_jit_equals_eager(op, variant, rng):
    for dtype in op.dtypes:
        args, kwargs = op.make(np, rng, SHAPE, dtype, **variant)
        args, kwargs = _as_jax(list(args)), {k: _as_jax(v) for k, v in kwargs.items()}
        arrays: list = []
        spec = flat((args, kwargs), arrays)

        def fn(*arrays):
            a, k = unflat(spec, arrays)
            return op.fn(*a, **k)

        eager = op.fn(*args, **kwargs)
        _same(jax.jit(fn)(*arrays), eager)


def test_jit_takes_a_policy_and_jax_dtypes(rng):
    x = jnp.asarray(op_table.float_input(np, rng, SHAPE, "float32"))
    policy = cq.KernelPolicy(tiles=False)

    def fn(x):
        q, p = cq.quantize_groupwise(x, 8, True, 128, policy=policy)
        return cq.dequantize_groupwise(q, p, 8, True, 128, jnp.bfloat16, policy=policy)

    _same(jax.jit(fn)(x), fn(x))


def test_torchs_float4_codes_are_refused_for_jax(rng):
    x = jnp.asarray(op_table.float_input(np, rng, SHAPE, "float32"))
    for call in (lambda x: cq.quantize_mxfp4(x, codes_dtype="float4_e2m1fn_x2"),
                 jax.jit(lambda x: cq.quantize_nvfp4(x, codes_dtype="float4_e2m1fn_x2"))):
        with pytest.raises(ValueError, match="codes_dtype='float4_e2m1fn_x2' is torch's"):
            call(x)


def test_jit_refuses_a_stream(rng):
    x = jnp.asarray(op_table.float_input(np, rng, SHAPE, "float32"))
    with pytest.raises(TypeError, match="quantize_int8_per_channel: stream= is not taken"):
        jax.jit(lambda x: cq.quantize_int8_per_channel(x, stream=1))(x)


def test_a_traced_array_after_a_host_one_is_refused(rng):
    x = op_table.float_input(np, rng, SHAPE, "float32")
    with pytest.raises(TypeError, match="scale is traced"):
        jax.jit(lambda s: cq.quantize_int8_per_tensor(x, scale=s))(jnp.float32(0.5))
