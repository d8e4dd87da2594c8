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
# of fewer than groups.WARP_MIN_UNITS units, the general path and the spanning kernel): one,
# since each unit already has two 16-bit parameter loads in flight, and more units a thread
# cost the registers that keep warps resident.
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
# instead, and the tile kernel's format (docs/performance.md has the measurements):
# - rounding to nearest has kernels of its own, without the stochastic modes' code; so has
#   seeded rounding's tile kernel, which then fits four blocks a multiprocessor. Seeded
#   rounding's staged kernels keep the general format: built for seeded rounding alone,
#   some of them came out of ptxas with the uniform-register hazard that
#   benchmarks/sass_audit.py looks for. The kernels that hold groups in registers (small or
#   unaligned inputs) serve every mode;
# - in one pass, rounding to nearest holds 2 units a thread (more resident warps for its
#   light arithmetic), the stochastic modes 4 (their random words need the loads in flight);
# - two passes serve rounding to nearest and the caller's words from 2 to 32 units, seeded
#   rounding at 4 units only, where its Philox words are drawn a unit at a time without
#   waste; groups of one unit keep one pass in every mode.
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
        return outputs.make(stream)[0], False
    run = QuantizeRun(outputs, plan, mode, seed)
    if xc is x and rb is rbits:  # a seeded call's replay takes the seed at run time
        _fast.offer(run)
    return run(stream, (xc.data.ptr,) if rb is None else (xc.data.ptr, rb.data.ptr)), False


def dequantize(stream, q, scales, zeros, ts, bits, g, out, policy=DEFAULT_POLICY):
    qc, sc, zc = contiguous(q), contiguous(scales), contiguous(zeros)
    return dequantize_to_new(stream, SRC, _zp_codes(bits, ts), out, bits, g, qc, sc, zc,
                             DQ_UNROLL, qc is q and sc is scales and zc is zeros, policy)


