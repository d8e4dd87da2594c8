"""The three steps every symmetric format shares, in NumPy: choose the scale, quantize,
dequantize. float32 throughout; NumPy's float32 division is IEEE correctly rounded and
keeps subnormals, which is what the contract asks for (docs/formats.md section 1)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .._core.dtypes import E4M3, INT8, CodeType, FloatType

F32 = np.float32
_FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def f32(x: np.ndarray) -> np.ndarray:
    """x as float32 (exact from float16, bfloat16 and float32)."""
    return np.asarray(x).astype(np.float32)


def canonical_nan(a: np.ndarray, bits: int) -> np.ndarray:
    """Replace every NaN by the canonical NaN a GPU produces (in place; returns a)."""
    nan = np.isnan(a.astype(np.float32)) if a.dtype != np.float32 else np.isnan(a)
    if nan.any():
        view = a.view(np.uint32 if a.itemsize == 4 else np.uint16)
        view[nan] = bits
    return a


def abs_max(x32: np.ndarray, axis=None) -> np.ndarray:
    """max |x| over axis; a NaN anywhere makes it NaN; an empty axis gives 0; float32."""
    return np.max(np.abs(x32), axis=axis, initial=np.float32(0)).astype(np.float32)


def abs_max_runs(x32: np.ndarray, run: int) -> np.ndarray:
    """max |x| over runs of `run` consecutive elements of the last axis (the last run may
    be shorter): [..., K] -> [..., ceil(K / run)]."""
    k = x32.shape[-1]
    if k == 0 or x32.size == 0:
        return np.zeros(x32.shape[:-1] + (-(-k // run),), dtype=np.float32)
    starts = np.arange(0, k, run)
    return np.maximum.reduceat(np.abs(x32), starts, axis=-1).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Step 1: choose the scale

def at_least_min_subnormal(s: np.ndarray) -> np.ndarray:
    """A scale product (>= 0 or NaN) that rounded to 0 raised to 2**-149: a nonzero group
    never gets a zero scale."""
    bits = np.array(s, dtype=np.float32).view(np.uint32)
    np.maximum(bits, np.uint32(1), out=bits)
    return bits.view(np.float32)


def scale_zero_is_one(amax: np.ndarray, code: CodeType) -> np.ndarray:
    """amax * C(1/qmax), at least 2**-149, or 1 where amax == 0 (NaN and inf carry
    through)."""
    amax = np.asarray(amax, dtype=np.float32)
    s = np.where(amax == 0, F32(1.0), amax * code.inv_qmax).astype(np.float32)
    return canonical_nan(at_least_min_subnormal(s), 0x7FFFFFFF)


def scale_floor(amax: np.ndarray, eps: np.float32, code: CodeType) -> np.ndarray:
    """max(amax, eps) * C(1/qmax), at least 2**-149; np.maximum keeps NaN, as the contract
    asks."""
    s = (np.maximum(np.asarray(amax, dtype=np.float32), F32(eps)) * code.inv_qmax).astype(np.float32)
    return canonical_nan(at_least_min_subnormal(s), 0x7FFFFFFF)


def stored_scale(s: np.ndarray, scale_type: FloatType) -> np.ndarray:
    """Float32 scales as stored in `scale_type`: rounded to it, nearest even, NaN canonical
    (float32 scales are returned as they are)."""
    if scale_type.numpy == s.dtype:
        return s
    with np.errstate(over="ignore"):
        return canonical_nan(s.astype(scale_type.numpy), scale_type.nan_bits)


def ceil_pow2(s: np.ndarray) -> np.ndarray:
    """The smallest power of two >= s, computed on the bits (s >= 0; NaN and inf stay)."""
    s = np.asarray(s, dtype=np.float32).copy()
    bits = s.view(np.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    special = (mag >= 0x7F800000) | (mag == 0)
    sub = (mag < 0x00800000) & ~special
    normal = ~special & ~sub
    out = bits.copy()
    # normal: bump the exponent unless the mantissa is already zero
    bump = normal & ((mag & np.uint32(0x007FFFFF)) != 0)
    out[bump] = (bits[bump] & np.uint32(0x80000000)) | (
        (mag[bump] & np.uint32(0x7F800000)) + np.uint32(0x00800000))
    # subnormal: the next power of two of the bit pattern itself
    if sub.any():
        m = mag[sub].astype(np.uint64)
        p = np.left_shift(np.uint64(1), np.ceil(np.log2(m.astype(np.float64))).astype(np.uint64))
        out[sub] = (bits[sub] & np.uint32(0x80000000)) | p.astype(np.uint32)
    return out.view(np.float32)


# ---------------------------------------------------------------------------------------
# Step 2: quantize

def encode_int8(v: np.ndarray) -> np.ndarray:
    """clamp(rne(v), -127, 127) as int8; NaN gives 0."""
    with np.errstate(invalid="ignore"):
        q = np.clip(np.rint(v), F32(INT8.qmin), F32(INT8.qmax))
    q[np.isnan(q)] = 0
    return q.astype(np.int8)


def encode_e4m3(v: np.ndarray) -> np.ndarray:
    """e4m3(clamp(v, -448, 448)), round to nearest even, NaN as 0x7F; returns the codes as
    ml_dtypes.float8_e4m3fn."""
    c = np.clip(np.asarray(v, dtype=np.float32), F32(E4M3.qmin), F32(E4M3.qmax))
    codes = c.astype(_FP8).view(np.uint8)
    codes[np.isnan(c)] = 0x7F
    return codes.view(_FP8)


ENCODERS = {INT8.name: encode_int8, E4M3.name: encode_e4m3}


def quantize(x32: np.ndarray, scale: np.ndarray, code: CodeType) -> np.ndarray:
    """Encode x / scale (IEEE float32 division; scale broadcast against x)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = (x32 / scale).astype(np.float32)
    return ENCODERS[code.name](v)


# ---------------------------------------------------------------------------------------
# Step 3: dequantize

def decode(codes: np.ndarray, code: CodeType) -> np.ndarray:
    """Codes to float32 (exact). fp8 codes may come as float8_e4m3fn or uint8."""
    if code is E4M3:
        return np.asarray(codes).view(_FP8).astype(np.float32)
    return np.asarray(codes).astype(np.float32)


def dequantize(codes: np.ndarray, scale: np.ndarray, code: CodeType, out: FloatType) -> np.ndarray:
    """out(f32(code) * scale): one float32 product, rounded once to the output type."""
    with np.errstate(invalid="ignore", over="ignore"):
        prod = (decode(codes, code) * scale).astype(np.float32)
        res = prod.astype(out.numpy)
    return canonical_nan(res, out.nan_bits)
