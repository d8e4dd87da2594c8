"""NumPy twins of the INT8 family (docs/formats.md section 3): same names, signatures and bits
as the GPU kernels. Inputs are valid NumPy arrays (the public functions check them)."""

from __future__ import annotations

import numpy as np

from .._core.dtypes import FLOAT32, INT8, FloatType
from . import _core


def quantize_int8_per_tensor(x, scale=None):
    x32 = _core.f32(x)
    if scale is None:
        s = _core.scale_zero_is_one(_core.abs_max(x32), INT8).reshape(1)
    else:
        s = np.asarray(scale, dtype=np.float32).reshape(1).copy()
    return _core.quantize(x32, s, INT8), s


def quantize_int8_per_channel(w, scale_type: FloatType = FLOAT32):
    w32 = _core.f32(w)
    s = _core.stored_scale(_core.scale_zero_is_one(_core.abs_max(w32, axis=-1), INT8), scale_type)
    return _core.quantize(w32, _core.f32(s)[:, None], INT8), s


def quantize_int8_per_block(x, block_size=128):
    x32 = _core.f32(x)
    s = _core.scale_zero_is_one(_core.abs_max_runs(x32, block_size), INT8)
    return _core.quantize(x32, np.repeat(s, block_size, axis=-1)[:, : x32.shape[-1]], INT8), s


def smooth_quant(x, smooth):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        xs = (_core.f32(x) / np.asarray(smooth, dtype=np.float32)).astype(np.float32)
    s = _core.scale_zero_is_one(_core.abs_max(xs, axis=-1), INT8)
    return _core.quantize(xs, s[:, None], INT8), s


def dequantize_int8_per_tensor(q, scale, dtype: FloatType):
    return _core.dequantize(q, np.asarray(scale, dtype=np.float32).reshape(()), INT8, dtype)


def dequantize_int8_per_channel(q, scale, dtype: FloatType):
    return _core.dequantize(q, np.asarray(scale, dtype=np.float32)[:, None], INT8, dtype)


def dequantize_int8_per_block(q, scale, dtype: FloatType, block_size=128):
    s = np.repeat(np.asarray(scale, dtype=np.float32), block_size, axis=-1)[:, : q.shape[-1]]
    return _core.dequantize(q, s, INT8, dtype)
