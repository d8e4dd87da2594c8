"""NumPy twins of the group-wise integer family in DeepSpeed's format (docs/formats.md section
5): same names, signatures and bits as the GPU kernels. Inputs are valid NumPy arrays (the
public functions check them).

Groups are runs of `group_size` consecutive elements of the C-order flattened tensor. The
group minimum and maximum propagate NaN and order -0 below +0 (IEEE 754-2019 minimum and
maximum), so that every zero's sign is determined."""

from __future__ import annotations

import numpy as np

from .._core.dtypes import FloatType, float_type_named
from . import _core

F32 = np.float32
NAN32 = 0x7FFFFFFF


def out_type(dtype) -> FloatType:
    return dtype if isinstance(dtype, FloatType) else float_type_named(dtype, "cuquant")


def group_min_max(x32g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of each row of a [groups, G] float32 array (G >= 1): NaN wins, -0 < +0."""
    with np.errstate(invalid="ignore"):
        hi = np.max(x32g, axis=1) if x32g.size else np.zeros(x32g.shape[0], F32)
        lo = np.min(x32g, axis=1) if x32g.size else np.zeros(x32g.shape[0], F32)
    hi, lo = hi.astype(F32), lo.astype(F32)
    bits = x32g.view(np.uint32)
    zhi = np.nonzero(hi == 0)[0]
    if zhi.size:  # the maximum is a zero: +0 if any element is +0
        hi[zhi] = np.where((bits[zhi] == 0).any(axis=1), F32(0.0), F32(-0.0))
    zlo = np.nonzero(lo == 0)[0]
    if zlo.size:  # the minimum is a zero: -0 if any element is -0
        lo[zlo] = np.where((bits[zlo] == 0x80000000).any(axis=1), F32(-0.0), F32(0.0))
    return lo, hi


def encode_signed(v: np.ndarray, bits: int) -> np.ndarray:
    """clamp(rne(v), -2**(bits-1), 2**(bits-1) - 1) as int8; NaN gives 0."""
    with np.errstate(invalid="ignore"):
        c = np.clip(np.rint(v), F32(-(1 << (bits - 1))), F32((1 << (bits - 1)) - 1))
    c[np.isnan(c)] = 0
    return c.astype(np.int8)


def pack_nibbles(codes: np.ndarray, low_first: bool) -> np.ndarray:
    """Pairs of consecutive codes along the last axis, two a byte (uint8)."""
    c = codes.view(np.uint8) if codes.dtype.itemsize == 1 else codes.astype(np.uint8)
    first, second = c[..., 0::2] & 0xF, c[..., 1::2] & 0xF
    if low_first:
        return (first | (second << 4)).astype(np.uint8)
    return ((first << 4) | second).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray, low_first: bool, signed: bool) -> np.ndarray:
    """The inverse of pack_nibbles: [..., K/2] bytes to [..., K] codes (int8 or uint8)."""
    b = np.asarray(packed).view(np.uint8)
    lo, hi = b & 0xF, b >> 4
    first, second = (lo, hi) if low_first else (hi, lo)
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = first
    out[..., 1::2] = second
    if signed:
        return ((out << 4).astype(np.uint8).view(np.int8) >> 4).astype(np.int8)
    return out


def packed_shape(shape: tuple, bits: int) -> tuple:
    return shape if bits == 8 else shape[:-1] + (shape[-1] // 2,)


def unpacked_shape(shape: tuple, bits: int) -> tuple:
    return shape if bits == 8 else shape[:-1] + (shape[-1] * 2,)


# ---------------------------------------------------------------------------------------

def group_multipliers(lo, hi, bits, symmetric):
    """(mult, offset) of groups with float32 minima lo and maxima hi: the code of x is
    rne((x - offset) * mult), clamped (docs/formats.md section 5)."""
    rng = F32(1 << bits)
    with np.errstate(all="ignore"):
        if symmetric:
            m = np.maximum(np.abs(lo), np.abs(hi))
            mult = np.where(m == 0, F32(1.0), rng / (m * F32(2.0))).astype(F32)
            offset = np.zeros_like(mult)
        else:
            mult = np.where(hi == lo, F32(1.0), rng / (hi - lo)).astype(F32)
            offset = ((hi + lo) * F32(0.5)).astype(F32)
    return mult, offset


def quantize_groupwise(x, bits, symmetric, group_size):
    x = np.asarray(x)
    x32 = _core.f32(x).reshape(-1, group_size)
    lo, hi = group_min_max(x32)
    mult, offset = group_multipliers(lo, hi, bits, symmetric)
    with np.errstate(all="ignore"):
        v = ((x32 - offset[:, None]).astype(F32) * mult[:, None]).astype(F32)
        inv = (F32(1.0) / mult).astype(F32)
    codes = encode_signed(v, bits).reshape(x.shape)
    params = inv[:, None] if symmetric else np.stack([inv, offset], axis=1)
    params = _core.canonical_nan(np.ascontiguousarray(params, dtype=F32), NAN32)
    if bits == 4:
        codes = pack_nibbles(codes, low_first=False).view(np.int8)
    return codes, params


def _codes(q, bits):
    q = np.asarray(q)
    if bits == 4:
        return unpack_nibbles(q, low_first=False, signed=True)
    return q.view(np.int8)


def dequantize_groupwise(q, params, bits, symmetric, group_size, dtype):
    out = out_type(dtype)
    c = _codes(q, bits)
    shape = c.shape
    c32 = c.astype(F32).reshape(-1, group_size)
    p = np.asarray(params, dtype=F32).reshape(c32.shape[0], 1 if symmetric else 2)
    with np.errstate(all="ignore"):
        y = (c32 * p[:, :1]).astype(F32)
        if not symmetric:
            y = (y + p[:, 1:2]).astype(F32)
        res = y.astype(out.numpy)
    return _core.canonical_nan(res, out.nan_bits).reshape(shape)


def dequantize_groupwise_batched(items, dtype):
    """items: (q, params, bits, symmetric, group_size) tuples; returns a list."""
    return [dequantize_groupwise(q, p, b, s, g, dtype) for q, p, b, s, g in items]


def quantize_int4_per_group(w, group_size=128):
    return quantize_groupwise(w, 4, False, group_size)


def dequantize_int4_per_group(packed, params, dtype, group_size=128):
    return dequantize_groupwise(packed, params, 4, False, group_size, dtype)
