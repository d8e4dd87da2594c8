"""NumPy twins of group-wise quantization with a zero point (docs/formats.md section 6), and
the counter-based generator that `seed=` uses, vectorized: same bits as the GPU kernels."""

from __future__ import annotations

import numpy as np

from .._core.dtypes import float_type_of
from . import _core
from .groupwise import F32, group_min_max, out_type, pack_nibbles, unpack_nibbles

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW = np.uint64(0xFFFFFFFF)
_EPS = F32(1e-5)


def philox4x32_10(counter, key):
    """Philox4x32-10 of Salmon et al. (2011). counter: four uint32 arrays (or scalars) of one
    shape; key: two uint32 values. Returns the four output words as uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in counter)
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for _ in range(10):
        p0 = c0.astype(np.uint64) * _M0
        p1 = c2.astype(np.uint64) * _M1
        hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & _LOW).astype(np.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & _LOW).astype(np.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint32(k0), lo1, hi0 ^ c3 ^ np.uint32(k1), lo0
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


def random_bits(shape, seed: int, offset: int = 0) -> np.ndarray:
    """The uint32 words `seed=` draws for an array of `shape`: element i (C order) takes
    word i % 4 of Philox4x32-10 with counter (i // 4 low word, i // 4 high word, 0, 0) and
    key (seed low word, seed high word). `offset` gives the words of elements offset,
    offset + 1, ... (a slice of a larger tensor)."""
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64))
    first = int(offset)
    blocks = np.arange(first // 4, (first + n + 3) // 4, dtype=np.uint64)
    zero = np.zeros(blocks.shape, np.uint32)
    seed = int(seed)
    words = philox4x32_10(((blocks & _LOW).astype(np.uint32), (blocks >> np.uint64(32)).astype(np.uint32),
                           zero, zero), (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    skip = first % 4
    return np.stack(words, axis=1).reshape(-1)[skip:skip + n].reshape(shape)


def quantize_groupwise_zero_point(x, bits=4, group_size=128, rounding="nearest", rbits=None,
                                  seed=None, symmetric=False):
    x = np.asarray(x)
    t = float_type_of(x.dtype)
    m, k = x.shape
    g = group_size
    qmax = F32((1 << bits) - 1)
    x32 = _core.f32(x).reshape(-1, g)
    lo, hi = group_min_max(x32)
    with np.errstate(all="ignore"):
        if symmetric:
            # s = T(max(amax, 1e-5) / (qmax / 2)); the zero point is the middle code.
            amax = np.maximum(np.abs(lo), np.abs(hi))
            s_t = (np.maximum(amax, _EPS) / (qmax / F32(2))).astype(F32).astype(t.numpy)
        else:
            s_t = (np.maximum((hi - lo).astype(F32), _EPS) / qmax).astype(F32).astype(t.numpy)
        s_t = _core.canonical_nan(s_t, t.nan_bits)
        s = s_t.astype(F32)
        if symmetric:
            z = np.full(s.shape, 1 << (bits - 1), np.int32)
        else:
            zq = (-lo / s).astype(F32)
            z = np.where(np.isnan(zq), F32(0), np.clip(np.rint(zq), F32(0), qmax)).astype(np.int32)
        v = (x32 / s[:, None]).astype(F32)
        if rounding == "nearest":
            r = np.rint(v)
        else:
            words = random_bits(x.shape, seed) if rbits is None else np.asarray(rbits, np.uint32)
            fl = np.floor(v)
            frac = (v - fl).astype(F32)
            up = (words.reshape(v.shape) >> np.uint32(8)).astype(F32) < frac * F32(1 << 24)
            r = (fl + up.astype(F32)).astype(F32)
        qf = (r + z[:, None].astype(F32)).astype(F32)
        q = np.where(np.isnan(qf), F32(0), np.clip(qf, F32(0), qmax)).astype(np.int32)
        deq = ((q - z[:, None]).astype(F32) * s[:, None]).astype(F32).astype(t.numpy)
    deq = _core.canonical_nan(deq, t.nan_bits).reshape(m, k)
    codes = q.astype(np.uint8).reshape(m, k)
    if bits == 4:
        codes = pack_nibbles(codes, low_first=True)
    zeros = z.astype(F32).astype(t.numpy).reshape(m, k // g)
    return codes, s_t.reshape(m, k // g), zeros, deq


def dequantize_groupwise_zero_point(q, scales, zeros, group_size, dtype, bits=None):
    out = out_type(dtype)
    q = np.asarray(q).view(np.uint8)
    scales, zeros = np.asarray(scales), np.asarray(zeros)
    if bits is None:
        bits = 8 if q.shape[-1] == scales.shape[-1] * group_size else 4
    c = unpack_nibbles(q, low_first=True, signed=False) if bits == 4 else q
    shape = c.shape
    c32 = c.astype(F32).reshape(-1, group_size)
    s = _core.f32(scales).reshape(-1, 1)
    z = _core.f32(zeros).reshape(-1, 1)
    with np.errstate(all="ignore"):
        res = ((c32 - z).astype(F32) * s).astype(F32).astype(out.numpy)
    return _core.canonical_nan(res, out.nan_bits).reshape(shape)
