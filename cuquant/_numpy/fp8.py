"""NumPy twins of the FP8 e4m3 family (docs/formats.md section 4): same names, signatures and
bits as the GPU kernels. Codes come out as ml_dtypes.float8_e4m3fn; inputs are checked
upstream."""

from __future__ import annotations

import numpy as np

from .._core.dtypes import E4M3, FLOAT32, FloatType
from . import _core

ROW_EPS = np.float32(1e-4)


def quantize_fp8_per_tensor(x, scale=None):
    x32 = _core.f32(x)
    if scale is None:
        s = _core.scale_zero_is_one(_core.abs_max(x32), E4M3).reshape(1)
    else:
        s = np.asarray(scale, dtype=np.float32).reshape(1).copy()
    return _core.quantize(x32, s, E4M3), s


def quantize_fp8_per_row(x, scale_type: FloatType = FLOAT32):
    x32 = _core.f32(x)
    s = _core.stored_scale(_core.scale_floor(_core.abs_max(x32, axis=-1), ROW_EPS, E4M3), scale_type)
    return _core.quantize(x32, _core.f32(s)[..., None], E4M3), s


def token_group_scale_buffer(m: int, groups: int) -> np.ndarray:
    """The column layout's storage: [groups, round_up(M, 4)], padding zeroed."""
    return np.zeros((groups, -(-m // 4) * 4), dtype=np.float32)


def quantize_fp8_per_token_group(x, group_size=128, eps=1e-4, scale_layout="row",
                                 scale_format="float32"):
    x32 = _core.f32(x)
    s = _core.scale_floor(_core.abs_max_runs(x32, group_size), np.float32(eps), E4M3)
    if scale_format == "ue8m0":
        s = _core.ceil_pow2(s)
    q = _core.quantize(x32, np.repeat(s, group_size, axis=-1)[:, : x32.shape[-1]], E4M3)
    if scale_layout == "column":
        buf = token_group_scale_buffer(s.shape[0], s.shape[1])
        buf[:, : s.shape[0]] = s.T
        s = buf[:, : s.shape[0]].T
    return q, s


def quantize_fp8_per_block(w, block_size=(128, 128), scale_format="float32"):
    bn, bk = block_size
    w32 = _core.f32(w)
    n, k = w32.shape
    tn, tk = -(-n // bn), -(-k // bk)
    padded = np.zeros((tn * bn, tk * bk), dtype=np.float32)  # zeros never raise a max
    padded[:n, :k] = np.abs(w32)
    amax = np.max(padded.reshape(tn, bn, tk, bk), axis=(1, 3))
    s = _core.scale_zero_is_one(amax, E4M3)
    if scale_format == "ue8m0":
        s = _core.ceil_pow2(s)
    full = np.repeat(np.repeat(s, bn, axis=0), bk, axis=1)[:n, :k]
    return _core.quantize(w32, full, E4M3), s


def dequantize_fp8_per_tensor(q, scale, dtype: FloatType):
    return _core.dequantize(q, np.asarray(scale, dtype=np.float32).reshape(()), E4M3, dtype)


def dequantize_fp8_per_row(q, scale, dtype: FloatType):
    return _core.dequantize(q, np.asarray(scale, dtype=np.float32)[..., None], E4M3, dtype)


def dequantize_fp8_per_token_group(q, scale, dtype: FloatType, group_size=128):
    s = np.repeat(np.asarray(scale, dtype=np.float32), group_size, axis=-1)[:, : q.shape[-1]]
    return _core.dequantize(q, s, E4M3, dtype)


def dequantize_fp8_per_block(q, scale, dtype: FloatType, block_size=(128, 128)):
    bn, bk = block_size
    n, k = q.shape
    s = np.repeat(np.repeat(np.asarray(scale, dtype=np.float32), bn, axis=0), bk, axis=1)[:n, :k]
    return _core.dequantize(q, s, E4M3, dtype)
