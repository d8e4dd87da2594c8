"""NumPy twins of the microscaling formats (docs/formats.md section 9): MXFP8, MXFP4 and NVFP4.
Codes and scale bytes are computed with integer and float32 operations (ml_dtypes' casts to
these formats round and saturate otherwise); ml_dtypes gives the dtypes and the decoding."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .._core.dtypes import E4M3, E8M0, FloatType
from . import _core
from .zero_point import random_bits

F32 = np.float32
U32 = np.uint32
FLT_MAX = F32(np.finfo(np.float32).max)
MX_BLOCK, NV_BLOCK = 32, 16
E4M3_EMAX, E2M1_EMAX = 8, 2

# e2m1 magnitudes by code (0..7); bit 3 of a code is the sign.
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)
# Rounding to nearest even: the code is the number of these bounds below |v|, strictly
# (ties 0.25, 1.25, 2.5 and 5 go down, to the even code) or not (0.75, 1.75 and 3.5 go up).
_ABOVE = (F32(0.25), F32(1.25), F32(2.5), F32(5.0))
_AT_OR_ABOVE = (F32(0.75), F32(1.75), F32(3.5))


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=F32).view(U32)


def exponent_field(a: np.ndarray) -> np.ndarray:
    """ef(a): the biased exponent field of float32 a, as int32."""
    return ((_bits(a) >> U32(23)) & U32(0xFF)).astype(np.int32)


def e8m0_rceil(amax: np.ndarray, inv_max: np.float32) -> np.ndarray:
    """E8M0 bytes, rounded up from d = amax * C(1/max): ef(d) + 1 where d is normal with a
    nonzero mantissa or subnormal with mantissa above 0x400000, else ef(d); NaN and
    infinite amax give 0xFF."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = (amax * inv_max).astype(F32)
    bits = _bits(d)
    e = ((bits >> U32(23)) & U32(0xFF)).astype(np.int32)
    m = bits & U32(0x7FFFFF)
    up = np.where(e > 0, m != 0, m > 0x400000)
    b = e + up.astype(np.int32)
    return np.where(np.isfinite(amax), b, 0xFF).astype(np.uint8)


def e8m0_floor(amax: np.ndarray, emax: int) -> np.ndarray:
    """E8M0 bytes of OCP's rule: clamp(ef(amax) - 127 - emax, -127, 128) + 127; NaN and
    infinite amax give 0xFF."""
    b = np.clip(exponent_field(amax) - 127 - emax, -127, 128) + 127
    return np.where(np.isfinite(amax), b, 0xFF).astype(np.uint8)


def e8m0_scale_bytes(amax: np.ndarray, scale_mode: str, fmt_max: float, emax: int) -> np.ndarray:
    amax = np.asarray(amax, dtype=F32)
    if scale_mode == "rceil":
        return e8m0_rceil(amax, F32(1.0) / F32(fmt_max))
    return e8m0_floor(amax, emax)


def e8m0_inverse(b: np.ndarray) -> np.ndarray:
    """f32 2**(127 - b): bits (254 - b) << 23; 0x00400000 (2**-127) for b = 254, NaN for 255."""
    b = np.asarray(b, dtype=np.int32)
    bits = np.where(b == 254, 0x00400000, (254 - np.minimum(b, 254)) << 23).astype(U32)
    bits = np.where(b == 255, U32(0x7FC00000), bits)
    return bits.view(F32)


def e8m0_value(b: np.ndarray) -> np.ndarray:
    """f32 2**(b - 127) (2**-127 is subnormal), NaN for 255."""
    return np.asarray(b, dtype=np.uint8).view(E8M0.numpy).astype(F32)


def e2m1_nearest(v: np.ndarray) -> np.ndarray:
    """e2m1 codes (uint8, 0..15) of float32 v, round to nearest even, saturating at 6, the
    sign in bit 3 (also for -0); NaN gives 0."""
    v = np.asarray(v, dtype=F32)
    a = np.abs(v)
    mag = np.zeros(v.shape, np.uint8)
    for t in _ABOVE:
        mag += a > t
    for t in _AT_OR_ABOVE:
        mag += a >= t
    sign = ((_bits(v) >> U32(28)) & U32(8)).astype(np.uint8)
    return np.where(np.isnan(v), np.uint8(0), sign | mag)


def e2m1_stochastic(v: np.ndarray, words: np.ndarray) -> np.ndarray:
    """e2m1 codes of v with stochastic rounding: for a = |v| between grid points
    lo <= a < hi, up iff f32(words >> 8) < (a - lo) / (hi - lo) * 2**24; saturating at 6."""
    v = np.asarray(v, dtype=F32)
    a = np.abs(v)
    lo_code = np.searchsorted(E2M1_VALUES, np.where(np.isnan(a), F32(0), a), side="right") - 1
    lo_code = lo_code.astype(np.int32)
    top = lo_code >= 7
    hi_code = np.minimum(lo_code + 1, 7)
    lo, hi = E2M1_VALUES[lo_code], E2M1_VALUES[hi_code]
    with np.errstate(invalid="ignore"):
        step = np.where(top, F32(1), hi - lo).astype(F32)
        frac = ((a - lo) / step).astype(F32)
        up = (words >> U32(8)).astype(F32) < (frac * F32(1 << 24)).astype(F32)
    mag = (lo_code + (up & ~top)).astype(np.uint8)
    sign = ((_bits(v) >> U32(28)) & U32(8)).astype(np.uint8)
    return np.where(np.isnan(v), np.uint8(0), sign | mag)


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    """float32 values of e2m1 codes (0..15)."""
    c = np.asarray(codes, dtype=np.uint8)
    mag = E2M1_VALUES[c & 7]
    return np.where(c & 8, -mag, mag).astype(F32)


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """[M, K] codes to [M, K/2] bytes, element 2i in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    p = np.asarray(packed).view(np.uint8)
    out = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


# ---------------------------------------------------------------------------------------
# The swizzled scale layout (128x4 tiles)

def swizzled_size(m: int, c: int) -> tuple[int, int]:
    """(R', C'): rows padded to a multiple of 128, scale columns to a multiple of 4."""
    return 128 * -(-m // 128), 4 * -(-c // 4)


def swizzled_index(r, c, cols: int):
    """Where scale (r, c) sits in the swizzled buffer of a [M, cols] scale matrix."""
    cp4 = -(-cols // 4)
    return (((r // 128) * cp4 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4)


def swizzle(s: np.ndarray) -> np.ndarray:
    """[M, C] scale bytes to the 1-D uint8 swizzled layout, padding 0."""
    m, c = s.shape
    rp, cp = swizzled_size(m, c)
    out = np.zeros(rp * cp, np.uint8)
    r, col = np.meshgrid(np.arange(m, dtype=np.int64), np.arange(c, dtype=np.int64), indexing="ij")
    out[swizzled_index(r, col, c)] = np.asarray(s).view(np.uint8)
    return out


def unswizzle(buf: np.ndarray, m: int, c: int) -> np.ndarray:
    """The [M, C] scale bytes of a swizzled buffer."""
    r, col = np.meshgrid(np.arange(m, dtype=np.int64), np.arange(c, dtype=np.int64), indexing="ij")
    return np.asarray(buf).view(np.uint8).reshape(-1)[swizzled_index(r, col, c)]


def _layout(scale_bytes: np.ndarray, scale_layout: str, dtype) -> np.ndarray:
    if scale_layout == "swizzled":
        return swizzle(scale_bytes)
    return scale_bytes.view(dtype)


def _scale_bytes(scales: np.ndarray, m: int, c: int) -> np.ndarray:
    """The [M, C] bytes of either layout."""
    s = np.asarray(scales)
    if s.ndim == 1:
        return unswizzle(s, m, c)
    return s.view(np.uint8).reshape(m, c)


def _blocks(x32: np.ndarray, block: int) -> np.ndarray:
    m, k = x32.shape
    return x32.reshape(m, k // block, block)


# ---------------------------------------------------------------------------------------
# MXFP8 and MXFP4

def _mx_scales(x32, scale_mode, fmt_max, emax):
    xb = _blocks(x32, MX_BLOCK)
    amax = _core.abs_max(xb, axis=-1)
    b = e8m0_scale_bytes(amax, scale_mode, fmt_max, emax)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (xb * e8m0_inverse(b)[..., None]).astype(F32)
    return b, v.reshape(x32.shape)


def quantize_mxfp8(x, scale_mode="rceil", scale_layout="row"):
    x32 = _core.f32(x)
    b, v = _mx_scales(x32, scale_mode, 448.0, E4M3_EMAX)
    return _core.encode_e4m3(v), _layout(b, scale_layout, E8M0.numpy)


def quantize_mxfp4(x, scale_mode="rceil", scale_layout="row", rounding="nearest", rbits=None,
                   seed=None):
    x32 = _core.f32(x)
    b, v = _mx_scales(x32, scale_mode, 6.0, E2M1_EMAX)
    return pack_e2m1(_e2m1(v, rounding, rbits, seed)), _layout(b, scale_layout, E8M0.numpy)


def _e2m1(v, rounding, rbits, seed):
    if rounding == "nearest":
        return e2m1_nearest(v)
    words = random_bits(v.shape, seed) if rbits is None else np.asarray(rbits, U32)
    return e2m1_stochastic(v, words.reshape(v.shape))


def _dequantize(values: np.ndarray, scale: np.ndarray, block: int, out: FloatType) -> np.ndarray:
    m, k = values.shape
    with np.errstate(invalid="ignore", over="ignore"):
        prod = (values.reshape(m, k // block, block) * scale[..., None]).astype(F32)
        res = prod.reshape(m, k).astype(out.numpy)
    return _core.canonical_nan(res, out.nan_bits)


def dequantize_mxfp8(q, scales, dtype: FloatType):
    q = np.asarray(q).view(np.uint8)
    m, k = q.shape
    b = _scale_bytes(scales, m, k // MX_BLOCK)
    return _dequantize(q.view(E4M3.numpy).astype(F32), e8m0_value(b), MX_BLOCK, dtype)


def dequantize_mxfp4(q, scales, dtype: FloatType):
    codes = unpack_e2m1(q)
    m, k = codes.shape
    b = _scale_bytes(scales, m, k // MX_BLOCK)
    return _dequantize(e2m1_decode(codes), e8m0_value(b), MX_BLOCK, dtype)


# ---------------------------------------------------------------------------------------
# NVFP4

def nvfp4_global_scales(amax) -> tuple[np.float32, np.float32]:
    """(S_enc, S_dec) of a global amax A: S_enc = 1 if A == 0 else min(f32(2688 / A),
    FLT_MAX) (NaN kept), S_dec = f32(1 / S_enc)."""
    a = F32(amax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if a == 0:
            enc = F32(1.0)
        else:
            q = F32(F32(2688.0) / a)
            enc = q if np.isnan(q) else min(q, FLT_MAX)
        dec = F32(F32(1.0) / enc)
    return F32(enc), dec


def quantize_nvfp4(x, global_amax=None, scale_layout="row", rounding="nearest", rbits=None,
                   seed=None):
    x32 = _core.f32(x)
    a = _core.abs_max(x32) if global_amax is None else F32(global_amax)
    enc, dec = nvfp4_global_scales(a)
    xb = _blocks(x32, NV_BLOCK)
    amax_b = _core.abs_max(xb, axis=-1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        factor = F32(enc * F32(F32(1.0) / F32(6.0)))
        t = (amax_b * factor).astype(F32)
        s = _core.encode_e4m3(np.where(np.isnan(t), t, np.minimum(t, F32(448.0))))
        sd = (s.astype(F32) * dec).astype(F32)
        r = (F32(1.0) / sd).astype(F32)
        r = np.where(np.isnan(r), r, np.minimum(r, FLT_MAX)).astype(F32)
        v = (xb * r[..., None]).astype(F32).reshape(x32.shape)
    packed = pack_e2m1(_e2m1(v, rounding, rbits, seed))
    scales = swizzle(s.view(np.uint8)) if scale_layout == "swizzled" else s
    return packed, scales, np.array([a], dtype=F32)


def dequantize_nvfp4(q, scales, global_amax, dtype: FloatType):
    codes = unpack_e2m1(q)
    m, k = codes.shape
    s = _scale_bytes(scales, m, k // NV_BLOCK).view(E4M3.numpy).astype(F32)
    _, dec = nvfp4_global_scales(np.asarray(global_amax, dtype=F32).reshape(()))
    with np.errstate(invalid="ignore", over="ignore"):
        scale = (s * dec).astype(F32)
    return _dequantize(e2m1_decode(codes), scale, NV_BLOCK, dtype)


__all__ = ["quantize_mxfp8", "dequantize_mxfp8", "quantize_mxfp4", "dequantize_mxfp4",
           "quantize_nvfp4", "dequantize_nvfp4", "swizzle", "unswizzle", "swizzled_index",
           "swizzled_size", "e2m1_nearest", "e2m1_stochastic", "e2m1_decode", "e8m0_rceil",
           "e8m0_floor", "nvfp4_global_scales"]
