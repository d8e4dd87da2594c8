"""The hand-over of results to JAX without a JAX op: a DLPack capsule of 16- or 8-bit
integers whose type code is rewritten reaches JAX as bfloat16 or float8_e4m3fn with the
same bits (checked on the CPU, through jaxlib's own import, as on a GPU)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuquant._core import arrays

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.mark.parametrize("dtype, code, as_int", [
    (ml_dtypes.bfloat16, arrays._DL_BFLOAT, np.uint16),
    (ml_dtypes.float8_e4m3fn, arrays._DL_FLOAT8_E4M3FN, np.uint8),
])
def test_a_retyped_capsule_reaches_jax_with_its_bits(dtype, code, as_int, rng):
    bits = rng.integers(0, np.iinfo(as_int).max, size=(3, 40), dtype=as_int)
    capsule = bits.__dlpack__()
    arrays._set_dlpack_code(capsule, code)
    out = arrays._jax_from_capsule(jax, capsule, jax.devices("cpu")[0], None, kind=1)
    assert out.dtype == np.dtype(dtype) and out.shape == bits.shape
    np.testing.assert_array_equal(np.asarray(out).view(as_int), bits)
