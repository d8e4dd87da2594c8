"""Arrays in and out on the host: each family gets its own family back (NumPy, ml_dtypes
bfloat16 and float8, PyTorch CPU tensors, JAX CPU arrays, DLPack and array-protocol
objects), with the same bits as the NumPy backend; bad arguments are refused clearly."""

import ml_dtypes
import numpy as np
import pytest

import cuquant as cq
from _util import assert_same_bits

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn


def test_numpy_family_and_dtypes(rng):
    x = (rng.standard_normal((33, 256)) * 3).astype(BF16)
    q, s = cq.quantize_fp8_per_token_group(x)
    assert type(q) is np.ndarray and q.dtype == FP8 and s.dtype == np.float32
    back = cq.dequantize_fp8_per_token_group(q, s, BF16)
    assert back.dtype == BF16
    # uint8 codes are float8 codes too
    assert_same_bits(cq.dequantize_fp8_per_token_group(q.view(np.uint8), s, BF16), back)


def test_non_contiguous_numpy(rng):
    base = (rng.standard_normal((64, 300)) * 2).astype(np.float16)
    view = base[:, 17:273:1][::2]
    assert not view.flags.c_contiguous
    assert_same_bits(cq.quantize_int8_per_channel(view)[0],
                     cq.quantize_int8_per_channel(np.ascontiguousarray(view))[0])


class DLPackOnly:
    """An array known only through DLPack."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class ArrayProtocolOnly:
    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a


def test_dlpack_and_array_protocol_objects(rng):
    x = rng.standard_normal((8, 128)).astype(np.float32)
    want = cq.quantize_int8_per_block(x)
    for wrapped in (DLPackOnly(x), ArrayProtocolOnly(x)):
        got = cq.quantize_int8_per_block(wrapped)
        assert type(got[0]) is np.ndarray
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])


def test_torch_cpu_in_torch_out(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy((rng.standard_normal((40, 384)) * 4).astype(np.float32)).to(torch.bfloat16)
    q, s = cq.quantize_fp8_per_block(x)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    host = cq.quantize_fp8_per_block(x.view(torch.int16).numpy().view(BF16))
    assert_same_bits(q, host[0])
    back = cq.dequantize_fp8_per_block(q, s, torch.bfloat16)
    assert back.dtype == torch.bfloat16 and back.shape == x.shape
    assert_same_bits(back, cq.dequantize_fp8_per_block(*host, BF16))
    q8, s8 = cq.quantize_int8_per_channel(x.t())  # a transposed (non-contiguous) view
    assert q8.dtype == torch.int8 and q8.shape == (384, 40)
    with pytest.raises(TypeError, match="dtype"):
        cq.dequantize_int8_per_channel(q8, s8, torch.int32)


def test_jax_cpu_in_jax_out(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = jnp.asarray((rng.standard_normal((16, 256)) * 2).astype(np.float32), dtype=jnp.bfloat16)
    q, s = cq.quantize_fp8_per_row(x)
    assert isinstance(q, jax.Array) and q.dtype == jnp.float8_e4m3fn
    host = cq.quantize_fp8_per_row(np.asarray(x))
    assert_same_bits(q, host[0])
    assert_same_bits(s, host[1])
    back = cq.dequantize_fp8_per_row(q, s, jnp.float16)
    assert isinstance(back, jax.Array) and back.dtype == jnp.float16


def test_refusals_of_arguments():
    x = np.ones((4, 128), np.float16)
    with pytest.raises(TypeError, match="x must be an array"):
        cq.quantize_fp8_per_token_group([[1.0] * 128])
    with pytest.raises(TypeError, match="stream"):
        cq.quantize_fp8_per_token_group(x, stream=1.5)
    with pytest.raises(TypeError, match="dtype"):
        cq.dequantize_int8_per_tensor(np.ones(4, np.int8), np.ones(1, np.float32), "float64")
