"""The zero-point format on the GPU (cuda_src/zero_point.cu, lmdeploy's QuantizeGroupwise):
its format policies in the shared group-wise kernel families, the builds of each rounding
mode, and its outputs."""

from __future__ import annotations

import itertools

from .._core import replay as _fast
from .._core.arrays import contiguous
from .._core.dtypes import FLOATS, HALVES, UINT4, UINT8, FloatType
from .._core.validate import BITS
from . import launch as _gpu
from .groups import (TWO_PASS_UNITS, QuantizeRun, dequant_kernels, dequantize_to_new,
                     quant_specializations, quantize_plan)
from .policy import DEFAULT_POLICY

SRC = "zero_point.cu"
NEAREST, RBITS, PHILOX = 0, 1, 2   # ZpMode in cuda_src/zero_point.cu
SYMMETRIC = 4   # ZP_SYMMETRIC: a flag over the rounding mode

# Units a dequantizing thread has in flight where each unit loads its own parameters (groups
# of fewer than groupwise.WARP_MIN_UNITS units, the general path and the spanning kernel):
# one, measured fastest on an H200 for this format (its two 16-bit parameter loads a unit;
# 0.84 / 0.91 of copy against 0.77 / 0.81 with four, at G=128 before groups shared their
# parameters; spanning groups of 20: 0.62-0.73 against 0.57-0.67 with two).
DQ_UNROLL = 1

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
# (cuda_src/zero_point.cu): it serves tensors of at most the policy's
# `seeded_build_max_elements` elements, and larger ones take the general build's tile kernel.
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

_outputs = _gpu.plan_table()  # the outputs' layout of each problem, worked out once


def quantize(stream, x, t, bits, g, mode, rbits, seed, policy=DEFAULT_POLICY):
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
    if rounding == PHILOX and x.size > policy.seeded_build_max_elements:
        tile_fmt_of_bits = _zp_format
    # The tile kernel a warp a tile (see groups.py): the zero point's three outputs keep a
    # warp's registers too busy for a second tile.
    plan = quantize_plan(SRC, _zp_format, xc, t, bits, g, rb, big=False, hold=hold,
                         two_pass_units=two_pass_units, staged_fmt_of_bits=staged_fmt_of_bits,
                         persistent_tiles=False, tile_fmt_of_bits=tile_fmt_of_bits,
                         policy=policy)
    if plan is None:
        return outputs.make(), False
    run = QuantizeRun(outputs, plan, mode, seed)
    # Seeded calls are not kept: a seed is part of the key, and seeds change call by call.
    if rounding != PHILOX and xc is x and rb is rbits:
        _fast.offer(run)
    return run(stream, (xc.data.ptr,) if rb is None else (xc.data.ptr, rb.data.ptr)), False


def dequantize(stream, q, scales, zeros, ts, bits, g, out, policy=DEFAULT_POLICY):
    qc, sc, zc = contiguous(q), contiguous(scales), contiguous(zeros)
    return dequantize_to_new(stream, SRC, _zp_codes(bits, ts), out, bits, g, qc, sc, zc,
                             DQ_UNROLL, qc is q and sc is scales and zc is zeros, policy)


