"""Group-wise quantization with a zero point and optional stochastic rounding (SPEC
section 6, lmdeploy's QuantizeGroupwise).

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

import itertools

import numpy as np

from . import _fast, _gpu, _numpy
from ._dtypes import FLOATS, HALVES, UINT4, UINT8, FloatType
from ._numpy.zero_point import random_bits
from ._op import HOST, contiguous, host_results, intake, out_dtype, run_gpu, same_place, stream_of, v
from .groupwise import (BITS, TWO_PASS_UNITS, QuantizeRun, check_bits, check_group_size,
                        dequant_kernels, dequantize_to_new, quant_specializations,
                        quantize_plan)

SRC = "zero_point.cu"
ROUNDINGS = ("nearest", "stochastic")
NEAREST, RBITS, PHILOX = 0, 1, 2   # ZpMode in cuda_src/zero_point.cu
SYMMETRIC = 4   # ZP_SYMMETRIC: a flag over the rounding mode

# Units a dequantizing thread has in flight where each unit loads its own parameters (groups
# of fewer than groupwise.WARP_MIN_UNITS units, the general path and the spanning kernel):
# one, measured fastest on an H200 for this format (its two 16-bit parameter loads a unit;
# 0.84 / 0.91 of copy against 0.77 / 0.81 with four, at G=128 before groups shared their
# parameters; spanning groups of 20: 0.62-0.73 against 0.57-0.67 with two).
DQ_UNROLL = 1

__all__ = ["quantize_groupwise_zero_point", "dequantize_groupwise_zero_point", "random_bits"]


def _zp_format(bits: int) -> str:
    return f"cq::ZeroPoint<{bits}>"


def _zp_nearest_format(bits: int) -> str:
    """The format built for rounding to nearest alone (no code of the stochastic modes)."""
    return f"cq::ZeroPoint<{bits}, cq::ZP_NEAREST>"


def _zp_seeded_format(bits: int) -> str:
    """The format built for seeded stochastic rounding alone (its tile kernel only): the
    tile kernel then fits four blocks a multiprocessor."""
    return f"cq::ZeroPoint<{bits}, cq::ZP_PHILOX>"


# The staged and tile quantizers by mode: the staged kernels' format, their units a thread
# in one pass, the group sizes (in 16-byte units) that take the two-pass staged kernel
# instead, and the tile kernel's format. Measured on an H200 (fp16 16384 x 7168,
# benchmarks/NOTES.md):
# - rounding to nearest has kernels of its own: without the stochastic modes' code they
#   are faster (two passes: 4-bit G=128 0.85 -> 0.865, 8-bit 0.865 -> 0.875, 4-bit G=16
#   0.79 -> 0.83). So has seeded rounding's tile kernel, which then fits four blocks a
#   multiprocessor (G=128 4-bit 0.62 -> 0.66, 8-bit 0.70 -> 0.75). Its staged kernels keep
#   the general format: built for seeded rounding alone, ten of them (8-bit) came out of
#   ptxas with the uniform-register hazard that benchmarks/sass_audit.py looks for, and
#   failed the staged GPU tests. The kernels that hold groups in registers (small or
#   unaligned inputs) serve every mode;
# - one pass, nearest with 2 units a thread against 4, 0.78 -> 0.82 (4-bit G=128), 0.71 ->
#   0.80 (4-bit G=64); seeded stochastic rounding loses with 2 (0.457 -> 0.424);
# - two passes against one gain for nearest from 2 to 32 units (4-bit G=128 0.83 -> 0.85,
#   8-bit G=32 0.79 -> 0.86, 8-bit G=16 0.60 -> 0.83) and for the caller's words (4-bit
#   G=32 0.62 -> 0.83); seeded rounding gains at 4 units only (8-bit G=32 0.39 -> 0.61;
#   G=16 0.58 -> 0.54, G=64 0.64 -> 0.63). Groups of one unit (G=8) keep one pass in every
#   mode (nearest 0.82 against 0.65, the caller's words 0.92 against 0.73).
_ABOVE_ONE_UNIT = tuple(u for u in TWO_PASS_UNITS if u > 1)
# Seeded rounding's own tile build takes every Philox counter's high word as 0
# (cuda_src/zero_point.cu): it serves tensors of at most 2**34 elements, and larger ones
# take the general build's tile kernel.
SEEDED_BUILD = {"max_elements": 1 << 34}
KERNELS_BY_MODE = {NEAREST: (_zp_nearest_format, 2, _ABOVE_ONE_UNIT, _zp_nearest_format),
                   RBITS: (_zp_format, 4, _ABOVE_ONE_UNIT, _zp_format),
                   PHILOX: (_zp_format, 4, (4,), _zp_seeded_format)}


def _zp_codes(bits: int, ts: FloatType) -> str:
    return f"cq::ZeroPointCodes<{bits}, {ts.cxx}>"


def _code_type(bits: int):
    return UINT4 if bits == 4 else UINT8


def specializations():
    """Every (source, name expression) this module can launch."""
    modes = KERNELS_BY_MODE.values()
    for fmt in dict.fromkeys(f for m in modes for f in (m[0], m[3])):
        plans = [(hold, units) for f, hold, units, _ in modes if f is fmt]
        yield from quant_specializations(
            SRC, fmt, HALVES.values(), big=False,
            holds=tuple(sorted({hold for hold, _ in plans})),
            two_pass_units=tuple(sorted({u for _, units in plans for u in units})),
            direct=fmt is _zp_format, staged=bool(plans), tiled=any(m[3] is fmt for m in modes))
    for bits, ts, out in itertools.product(BITS, HALVES.values(), FLOATS.values()):
        for expr in dequant_kernels(_zp_codes(bits, ts), out, bits, DQ_UNROLL):
            yield SRC, expr


# ---------------------------------------------------------------------------------------
# GPU

_outputs: dict = {}  # the outputs' layout of each problem, worked out once


def _gpu_quantize(stream, x, t, bits, g, mode, rbits, seed):
    m, k = x.shape
    xc = contiguous(x)
    key = (m, k, t.name, bits, g)
    outputs = _outputs.get(key)
    if outputs is None:
        outputs = _gpu.remember(_outputs, key, _gpu.Outputs(
            ((m, k // 2 if bits == 4 else k), _code_type(bits).numpy), ((m, k // g), t.numpy),
            ((m, k // g), t.numpy), ((m, k), t.numpy)))
    rb = None if rbits is None else contiguous(rbits)
    # The symmetric flag changes a group's parameters only: the rounding's kernels serve it.
    rounding = mode & ~SYMMETRIC
    staged_fmt_of_bits, hold, two_pass_units, tile_fmt_of_bits = KERNELS_BY_MODE[rounding]
    if rounding == PHILOX and x.size > SEEDED_BUILD["max_elements"]:
        tile_fmt_of_bits = _zp_format
    # The tile kernel a warp a tile (groupwise.TILES): 0.90 -> 0.955 of copy on an H200.
    plan = quantize_plan(SRC, _zp_format, xc, t, bits, g, rb, big=False, hold=hold,
                         two_pass_units=two_pass_units, staged_fmt_of_bits=staged_fmt_of_bits,
                         persistent_tiles=False, tile_fmt_of_bits=tile_fmt_of_bits)
    if plan is None:
        return outputs.make(), False
    run = QuantizeRun(outputs, plan, mode, seed)
    # Seeded calls are not kept: a seed is part of the key, and seeds change call by call.
    if rounding != PHILOX and xc is x and rb is rbits:
        _fast.offer(run)
    return run(stream, (xc.data.ptr,) if rb is None else (xc.data.ptr, rb.data.ptr)), False


def _gpu_dequantize(stream, q, scales, zeros, ts, bits, g, out):
    qc, sc, zc = contiguous(q), contiguous(scales), contiguous(zeros)
    return dequantize_to_new(stream, SRC, _zp_codes(bits, ts), out, bits, g, qc, sc, zc,
                             DQ_UNROLL, qc is q and sc is scales and zc is zeros)


# ---------------------------------------------------------------------------------------
# Public ops

def _seed(seed, op: str) -> int:
    s = v.check_int(seed, op, "seed")
    if not 0 <= s < 1 << 64:
        raise ValueError(f"{op}: seed must be in [0, 2**64); got {s}")
    return s


@_fast.replayable
def quantize_groupwise_zero_point(x, bits=4, group_size=128, rounding="nearest", rbits=None,
                                  seed=None, *, symmetric=False, stream=None):
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
    mode, r, sd = NEAREST, None, 0
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
            mode, sd = PHILOX, _seed(seed, op)
        else:
            mode = RBITS
            r = intake(rbits, op, "rbits", s)
            if r.data.dtype != np.uint32:
                raise TypeError(f"{op}: rbits must be uint32; got {v.dtype_name(r)}")
            v.check_shape(r, op, "rbits", (m, k), "[M, K], one word per element of x")
            same_place(op, ("x", a), ("rbits", r))
    if a.device == HOST:
        return host_results(a, _numpy.quantize_groupwise_zero_point(
            a.data, b, g, rounding, None if r is None else r.data, sd if mode == PHILOX else None,
            bool(symmetric)))
    if symmetric:
        mode |= SYMMETRIC
    return run_gpu(a, s, _gpu_quantize, a.data, t, b, g, mode, None if r is None else r.data, sd)


@_fast.replayable
def dequantize_groupwise_zero_point(q, scales, zeros, group_size, dtype, *, bits=None,
                                    stream=None):
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

    Returns
    -------
    x : array of `dtype`, [M, K]
    """
    op = "dequantize_groupwise_zero_point"
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
    return run_gpu(a, s, _gpu_dequantize, a.data, sc.data, zp.data, ts, b, g, out)


# ---------------------------------------------------------------------------------------
# Declarations for the GPU tests and the benchmark (cuquant/_registry.py)

ZP_SHAPES = ((1, 768), (7, 1536), (64, 7680), (130, 4608), (3, 768))   # K % 768 == 0


def _fit(shape, kw):
    from .groupwise import fit_shape

    shape = tuple(shape) if len(shape) == 2 else (1,) + (tuple(shape)[-1:] or (1,))
    return fit_shape(shape, kw.get("group_size", 128), kw.get("bits", 4) == 4, flat=False)


def _make_quantize(xp, rng, shape, dtype, **kw):
    from ._registry import float_input

    shape = _fit(shape, kw)
    x = float_input(xp, rng, shape, dtype)
    source = kw.pop("source", "seed")
    if kw.get("rounding") == "stochastic":
        if source == "rbits":
            words = rng.integers(0, 1 << 32, size=shape, dtype=np.uint32)
            kw["rbits"] = words if xp is np else xp.asarray(words)
        else:
            kw["seed"] = int(rng.integers(1 << 62))
    return (x,), kw


def _make_dequantize(xp, rng, shape, dtype, source_dtype="float16", **kw):
    from ._registry import float_input

    x = float_input(xp, rng, _fit(shape, kw), source_dtype)
    q, scales, zeros, _ = quantize_groupwise_zero_point(x, **kw)
    return (q, scales, zeros, kw.get("group_size", 128), dtype), {}


def t_quantize_zero_point(x, bits=4, group_size=128, rounding="nearest", rbits=None, seed=None,
                          symmetric=False):
    """torch eager: nearest rounding, not bit-exact (baseline only)."""
    import torch

    m, k = x.shape
    xf = x.float().reshape(m, k // group_size, group_size)
    hi, lo = xf.amax(dim=-1, keepdim=True), xf.amin(dim=-1, keepdim=True)
    qmax = 2 ** bits - 1
    if symmetric:
        s = (torch.maximum(hi.abs(), lo.abs()).clamp_min(1e-5) / (qmax / 2)).to(x.dtype).float()
        z = torch.full_like(s, 2 ** (bits - 1))
    else:
        s = ((hi - lo).clamp_min(1e-5) / qmax).to(x.dtype).float()
        z = (-lo / s).round().clamp(0, qmax)
    q = ((xf / s).round() + z).clamp(0, qmax)
    deq = ((q - z) * s).to(x.dtype).reshape(m, k)
    q = q.to(torch.uint8).reshape(m, k)
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    return q, s.to(x.dtype).reshape(m, -1), z.to(x.dtype).reshape(m, -1), deq


def t_dequantize_zero_point(q, scales, zeros, group_size, dtype):
    import torch

    if q.shape[1] * 2 == scales.shape[1] * group_size:
        q = torch.stack([q & 0xF, q >> 4], dim=-1).reshape(q.shape[0], -1)
    m, k = q.shape
    y = (q.float().reshape(m, -1, group_size) - zeros.float().unsqueeze(-1)) \
        * scales.float().unsqueeze(-1)
    return y.to(dtype).reshape(m, k)


def _declare():
    from ._registry import BENCH_SHAPES, F, H, Op, extend

    fam = "zero_point"
    groups = (32, 64, 128, 256, 6, 3)
    ops = []
    for bits, target in ((4, 0.90), (8, 0.92)):
        variants = tuple({"bits": bits, "group_size": g, "rounding": "nearest"} for g in groups)
        variants += tuple({"bits": bits, "group_size": g, "rounding": "stochastic", "source": src}
                          for g in (32, 64, 128, 256, 6) for src in ("seed", "rbits"))
        variants += tuple({"bits": bits, "group_size": g, "rounding": "nearest", "symmetric": True}
                          for g in groups)
        variants += tuple({"bits": bits, "group_size": g, "rounding": "stochastic", "source": src,
                           "symmetric": True} for g in (128, 6) for src in ("seed", "rbits"))
        ops.append(Op("quantize_groupwise_zero_point", fam, "quantize", H, _make_quantize,
                      variants=variants, shapes=ZP_SHAPES,
                      bench_variants=tuple({"bits": bits, "group_size": 128, "rounding": r}
                                           for r in ("nearest", "stochastic"))
                      + ({"bits": bits, "group_size": 128, "rounding": "nearest",
                          "symmetric": True},),
                      target=target, torch_ref=t_quantize_zero_point,
                      notes=f"{bits}-bit; stochastic draws Philox4x32-10 words in the kernel"))
    ops.append(Op("dequantize_groupwise_zero_point", fam, "dequantize", F, _make_dequantize,
                  variants=tuple({"bits": b, "group_size": g, "source_dtype": sd}
                                 for b in BITS for g in (128, 32, 256, 6) for sd in H),
                  shapes=ZP_SHAPES, bench_shapes=BENCH_SHAPES,
                  bench_variants=tuple({"bits": b, "group_size": 128} for b in BITS),
                  target=0.93, torch_ref=t_dequantize_zero_point))
    extend(ops, bench_dtype="float16")  # the contract benchmarks group-wise at fp16


_declare()
