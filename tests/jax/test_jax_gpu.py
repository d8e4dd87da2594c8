"""JAX CUDA arrays: every declared op gives the bits of the same call on CuPy arrays,
eagerly (the whole way and again) and inside jax.jit (a buffer callback on XLA's stream),
and on an array still being computed when the call is made."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # CuPy shares the GPU

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import op_table  # noqa: E402
from _util import assert_same_bits, framework_replays, op_variant_cases  # noqa: E402

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
jax = pytest.importorskip("jax")
from _jit_args import flat, unflat  # noqa: E402
jnp = jax.numpy

OPS = list(op_table.all_ops())
CASES = op_variant_cases(OPS)
SHAPES = ((16, 4096), (130, 7168))


@pytest.fixture(autouse=True)
def _gpu():
    try:
        if not jax.devices("gpu"):
            pytest.skip("needs JAX with a CUDA GPU")
    except RuntimeError:
        pytest.skip("needs JAX with a CUDA GPU")


def _to_jax(v, fp8=False):
    if isinstance(v, cp.ndarray):
        h = v.get()
        if fp8 and h.dtype == np.uint8:
            h = h.view(ml_dtypes.float8_e4m3fn)
        return jax.device_put(jnp.asarray(h), jax.devices("gpu")[0])
    if isinstance(v, (list, tuple)):
        return type(v)(_to_jax(e, fp8) for e in v)
    return v


def _same(j, c):
    j = tuple(j) if isinstance(j, (tuple, list)) else (j,)
    c = tuple(c) if isinstance(c, (tuple, list)) else (c,)
    assert len(j) == len(c)
    for a, b in zip(j, c):
        assert isinstance(a, jax.Array)
        assert_same_bits(a, b)


def _inputs(op, variant, rng, shape):
    args, kwargs = op.make(cp, rng, shape, op.dtypes[0], **variant)
    if "seed" in kwargs:
        kwargs = dict(kwargs, seed=99)
    fp8 = op.family == "fp8" and op.kind == "dequantize"
    return (args, kwargs, [_to_jax(a, fp8) for a in args],
            {k: _to_jax(v) for k, v in kwargs.items()})


@pytest.mark.parametrize("op, variant", CASES)
def test_jax_in_equals_cupy_in(op, variant, rng):
    for shape in SHAPES:
        args, kwargs, jargs, jkw = _inputs(op, variant, rng, shape)
        want = op.fn(*args, **kwargs)
        for _ in range(2):
            _same(op.fn(*jargs, **jkw), want)


@pytest.mark.parametrize("op, variant",
                         op_variant_cases(OPS, skip=("dequantize_groupwise_batched",)))
def test_jax_dtypes_and_new_seeds_take_the_replay(op, variant, rng, monkeypatch):
    """Repeated eager calls with JAX's own dtypes as arguments (jnp.bfloat16), arrays given
    by name and a new seed each call go the whole way once, then run its replay, and give
    the bits of the same call on CuPy arrays, and the same dtypes every time (the CuPy call
    made after the JAX call: a CuPy call with the same key would leave the replay the JAX
    call takes)."""
    seen, dtypes, _ = framework_replays(
        op, lambda: _inputs(op, variant, rng, (16, 4096)), jnp, _same, monkeypatch)
    assert len(dtypes) == 1, dtypes  # replayed or not, the same dtypes
    assert sum(m.startswith("jax") for m in seen) == 1


@pytest.mark.parametrize("op, variant", CASES)
def test_jit_equals_eager(op, variant, rng):
    for shape in SHAPES:
        args, kwargs, jargs, jkw = _inputs(op, variant, rng, shape)
        want = op.fn(*args, **kwargs)
        arrays: list = []
        spec = flat((list(jargs), jkw), arrays)

        def fn(*arrays):
            a, k = unflat(spec, arrays)
            return op.fn(*a, **k)

        f = jax.jit(fn)
        for _ in range(2):
            _same(f(*arrays), want)


def test_an_array_being_computed_is_waited_for(rng):
    """The input comes out of a long JAX computation dispatched just before the call: a
    call that read it before it was ready would see other values."""
    import cuquant as cq

    x = jax.device_put(jnp.asarray(rng.standard_normal((4096, 4096)).astype(np.float32)),
                       jax.devices("gpu")[0])
    slow = jax.jit(lambda x: jax.lax.fori_loop(0, 40, lambda i, y: y @ x * 1e-3 + x, x))
    y = slow(x).block_until_ready()
    cq.quantize_int8_per_channel(y)  # the whole way, leaving a replay
    for _ in range(2):  # the replay, then the whole way after the replays are forgotten
        y = slow(y)
        got = cq.quantize_int8_per_channel(y)
        want = cq.quantize_int8_per_channel(cp.asarray(np.asarray(y)))
        _same(got, want)
        from cuquant._core import replay

        replay.clear()
