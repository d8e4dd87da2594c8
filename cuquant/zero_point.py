"""Group-wise quantization with a zero point and optional stochastic rounding
(docs/formats.md section 6, lmdeploy's QuantizeGroupwise).

For x [M, K] and groups of `group_size` elements along K, with lo/hi a group's
minimum/maximum:

- ``s = dtype(max(hi - lo, f32(1e-5)) / f32(2**bits - 1))`` (stored in x's dtype; below,
  s means f32(s)); ``z = clamp(rne(-lo / s), 0, 2**bits - 1)``;
- or, with ``symmetric=True``, ``s = dtype(max(amax, f32(1e-5)) / f32((2**bits - 1) / 2))``
  with ``amax = max(|lo|, |hi|)`` (7.5 for 4 bits, 127.5 for 8: the divisor of
  compressed-tensors' and GPTQ's symmetric observers) and the fixed ``z = 2**(bits - 1)``;
  the signed code ``q - z`` then lies in [-2**(bits-1), 2**(bits-1) - 1];
- ``q = clamp(R(x / s) + z, 0, 2**bits - 1)``, a NaN giving 0, with R round half to even,
  or, for ``rounding="stochastic"``, ``R(v) = floor(v) + (f32(r >> 8) < frac(v) * 2**24)``
  for a uint32 random word r per element;
- the reconstruction ``dtype(f32(q - z) * s)`` is returned with the codes.

Codes are unsigned: bits=4 packs two a byte with the FIRST element in the LOW nibble
(uint8 [M, K/2], the bytes of lmdeploy's uint32 words); bits=8 stores one code a byte
(uint8 [M, K]).

The random words come from `rbits=` (uint32, shaped like x) or from `seed=`: element i
(C order) takes word i % 4 of Philox4x32-10 with counter (i // 4 as two 32-bit words, low
first, then 0, 0) and key (seed low word, seed high word), the same on CPU and GPU;
`random_bits(shape, seed)` returns those words.
"""

from __future__ import annotations

import numpy as np

from . import _numpy
from ._core import replay as _fast
from ._core.declare import Out, cdiv, declare, dtype_name, float_named
from ._core.arrays import HOST
from ._core.call import host_results, intake, out_dtype, same_place, stream_of, v
from ._core.dtypes import HALVES, UINT8
from ._core.validate import check_bits, check_group_size
from ._cuda import zero_point as _gpu_zero_point
from ._cuda.launch import run as run_gpu
from ._cuda.policy import DEFAULT_POLICY, check_policy
from ._numpy.zero_point import random_bits

ROUNDINGS = ("nearest", "stochastic")

__all__ = ["quantize_groupwise_zero_point", "dequantize_groupwise_zero_point", "random_bits"]


# ---------------------------------------------------------------------------------------
# Public ops

def _q_zp(a):
    m, k = a["x"].shape
    t = dtype_name(a["x"].dtype)
    g = k // a["group_size"]
    return [Out((m, k // 2 if a["bits"] == 4 else k), "uint8"), Out((m, g), t), Out((m, g), t),
            Out((m, k), t)]


@declare(_q_zp)
@_fast.replayable(values=v.SEED_VALUE)
def quantize_groupwise_zero_point(x, bits=4, group_size=128, rounding="nearest", rbits=None,
                                  seed=None, *, symmetric=False, stream=None,
                                  policy=DEFAULT_POLICY):
    """Quantize groups along K to unsigned codes with a zero point (lmdeploy's
    QuantizeGroupwise), optionally with stochastic rounding.

    Parameters
    ----------
    x : array [M, K], float16 or bfloat16
    bits : {4, 8}, default 4
        bits=4 needs an even K.
    group_size : int >= 1, default 128
        Must divide K (lmdeploy uses 32 to 256; any divisor works).
    rounding : {"nearest", "stochastic"}
    rbits : uint32 array [M, K], optional
        One random word per element, for ``rounding="stochastic"``: an element rounds up
        when ``f32(rbits >> 8) < frac * 2**24``.
    seed : int in [0, 2**64), optional
        For ``rounding="stochastic"`` instead of rbits: the words come from Philox4x32-10
        (see the module notes; `random_bits(x.shape, seed)` gives them), so one seed gives
        the same codes on CPU and GPU.
    symmetric : bool, default False
        A scale from the group's largest magnitude, ``dtype(max(amax, f32(1e-5)) /
        f32((2**bits - 1) / 2))``, and the fixed zero point ``2**(bits - 1)`` (8 or 128):
        the unsigned codes are the signed codes of compressed-tensors' symmetric formats
        plus that offset. Works with either rounding.
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : uint8 array
        bits=4: [M, K/2], the first element of each pair in the low nibble. bits=8: [M, K].
    scales : array [M, K / group_size], x's dtype
    zeros : array [M, K / group_size], x's dtype
        Integer zero points in [0, 2**bits - 1] (all ``2**(bits - 1)`` when symmetric).
    dequant : array [M, K], x's dtype
        The reconstruction ``dtype(f32(q - z) * f32(s))``.
    """
    op = "quantize_groupwise_zero_point"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    b = check_bits(bits, op)
    v.check_choice(rounding, op, "rounding", ROUNDINGS)
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"{op}: symmetric must be True or False; got {symmetric!r}")
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x", HALVES)
    v.check_ndim(a, op, "x", 2, "[M, K]")
    m, k = a.data.shape
    g = check_group_size(group_size, op, k, "K, the columns of x")
    if b == 4 and k % 2:
        raise ValueError(f"{op}: x must have an even K for bits=4 (two codes a byte); got shape "
                         f"{(m, k)}")
    mode, r, sd = _gpu_zero_point.NEAREST, None, 0
    if rounding == "nearest":
        if rbits is not None or seed is not None:
            raise ValueError(f"{op}: rbits and seed apply to rounding='stochastic' only; got "
                             f"rounding='nearest' with {'rbits' if rbits is not None else 'seed'}")
    else:
        if (rbits is None) == (seed is None):
            raise ValueError(f"{op}: rounding='stochastic' needs exactly one of rbits (uint32 "
                             f"[M, K]) or seed (int); got "
                             f"{'both' if rbits is not None else 'neither'}")
        if seed is not None:
            mode, sd = _gpu_zero_point.PHILOX, v.check_seed(seed, op)
        else:
            mode = _gpu_zero_point.RBITS
            r = intake(rbits, op, "rbits", s)
            if r.data.dtype != np.uint32:
                raise TypeError(f"{op}: rbits must be uint32; got {v.dtype_name(r)}")
            v.check_shape(r, op, "rbits", (m, k), "[M, K], one word per element of x")
            same_place(op, ("x", a), ("rbits", r))
    if a.device == HOST:
        return host_results(a, _numpy.quantize_groupwise_zero_point(
            a.data, b, g, rounding, None if r is None else r.data,
            sd if mode == _gpu_zero_point.PHILOX else None, bool(symmetric)))
    if symmetric:
        mode |= _gpu_zero_point.SYMMETRIC
    return run_gpu(a, s, _gpu_zero_point.quantize, a.data, t, b, g, mode,
                   None if r is None else r.data, sd, policy)


def _dq_zp(a):
    m = a["q"].shape[0]
    k = a["scales"].shape[1] * a["group_size"]
    return [Out((m, k), float_named(a["dtype"]))]

@declare(_dq_zp)
@_fast.replayable
def dequantize_groupwise_zero_point(q, scales, zeros, group_size, dtype, *, bits=None,
                                    stream=None, policy=DEFAULT_POLICY):
    """Dequantize `quantize_groupwise_zero_point`: ``dtype(f32(f32(q) - f32(z)) * f32(s))``.

    Parameters
    ----------
    q : uint8 array [M, K/2] (bits=4, first element in the low nibble) or [M, K] (bits=8)
    scales : float16 or bfloat16 array [M, K / group_size]
    zeros : array [M, K / group_size] of the scales' dtype
    group_size : int >= 1
    dtype : float16, bfloat16 or float32
    bits : {4, 8}, optional
        Taken from the shapes when not given (K = scales.shape[1] * group_size).
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`, [M, K]
    """
    op = "dequantize_groupwise_zero_point"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    out = out_dtype(dtype, op)
    a = intake(q, op, "q", s)
    if a.data.dtype != UINT8.numpy:   # UINT4 codes are packed in the same storage
        raise TypeError(f"{op}: q must be uint8; got {v.dtype_name(a)}")
    v.check_ndim(a, op, "q", 2, "[M, K/2] or [M, K]")
    sc = intake(scales, op, "scales", s)
    ts = v.check_float(sc, op, "scales", HALVES)
    v.check_ndim(sc, op, "scales", 2, "[M, K / group_size]")
    zp = intake(zeros, op, "zeros", s)
    if zp.data.dtype != sc.data.dtype:
        raise TypeError(f"{op}: zeros must have the dtype of scales ({ts.name}); got "
                        f"{v.dtype_name(zp)}")
    g = v.check_int(group_size, op, "group_size", minimum=1)
    m, kq = a.data.shape
    k = sc.data.shape[1] * g
    if bits is None:
        b = 8 if kq == k else 4
    else:
        b = check_bits(bits, op)
    want = k if b == 8 else k // 2
    if b == 4 and k % 2 or kq != want:
        raise ValueError(
            f"{op}: q must have shape {(m, want) if not (b == 4 and k % 2) else '[M, K/2]'} "
            f"(bits={b}, K = scales.shape[1] * group_size = {k}); got {(m, kq)}")
    v.check_shape(sc, op, "scales", (m, k // g), f"[M, K / {g}]")
    v.check_shape(zp, op, "zeros", (m, k // g), f"[M, K / {g}]")
    same_place(op, ("q", a), ("scales", sc), ("zeros", zp))
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_groupwise_zero_point(a.data, sc.data, zp.data, g,
                                                                      out, b))
    return run_gpu(a, s, _gpu_zero_point.dequantize, a.data, sc.data, zp.data, ts, b, g, out,
                   policy)


