"""The microscaling formats on the GPU (cuda_src/microscaling.cu): MXFP8, MXFP4 and NVFP4
quantizers and dequantizers, one launch a call. Launch plans are worked out once per
problem and kept; `specializations()` lists every kernel for the compile check."""

from __future__ import annotations

import itertools

import numpy as np

from .._core.arrays import contiguous
from .._core.dtypes import E4M3, E8M0, FLOATS, FloatType
from .._core.replay import offer
from . import kernels as _kernels
from . import launch as _gpu
from .policy import DEFAULT_POLICY, KernelPolicy

SRC = "microscaling.cu"

MXFP8, MXFP4, NVFP4 = 0, 1, 2            # MxFormat
NEAREST, RBITS, PHILOX = 0, 1, 2         # MxRounding
SCALE_MODES = {"rceil": 0, "floor": 1}   # MxScaleMode
BLOCK = {MXFP8: 32, MXFP4: 32, NVFP4: 16}
FP4 = (MXFP4, NVFP4)
THREADS = 256


def _shape(fmt: int, vec: int, rounding: int) -> tuple[int, int]:
    """(vectors a lane holds of one block, chunks a lane takes a tile): MxQuantShape's VPL and
    U in cuda_src/microscaling/quantize.cuh (MXFP4 to nearest from 16-byte vectors: a whole
    block a lane; stochastic rounding: one chunk a lane, its random words beside it)."""
    if fmt == MXFP4 and vec == 8 and rounding != RBITS:
        return 4, 1
    return (2, 2) if rounding == NEAREST else (2, 1)


DEQUANT_UNROLL = 2  # MX_DEQUANT_UNROLL in cuda_src/microscaling/dequantize.cuh
# Waves of resident blocks an NVFP4 quantizer with a given amax launches at most: blocks that
# start together build their tables together, with no loads of theirs in flight; a few
# waves stagger the starts while each table still serves many tiles.
NV_WAVES = 6

_INV_MAX = {MXFP8: np.float32(1.0) / np.float32(448.0), MXFP4: np.float32(1.0) / np.float32(6.0),
            NVFP4: np.float32(1.0) / np.float32(6.0)}
_U8, _F32 = np.dtype(np.uint8), np.dtype(np.float32)


def _b(v: bool) -> str:
    return "true" if v else "false"


def quantize_expr(t: FloatType, fmt: int, vec: int, aligned: bool, rounding: int,
                  grid_amax: bool) -> str:
    return (f"cq::quantize_mx<{t.cxx}, {fmt}, {vec}, {_b(aligned)}, {rounding}, "
            f"{_b(grid_amax)}>")


def dequant_expr(fmt: int, out: FloatType, aligned: bool) -> str:
    return f"cq::dequantize_mx<{fmt}, {out.cxx}, {_b(aligned)}>"


def _quant_kinds():
    """(fmt, rounding, grid_amax) of every quantizer build."""
    yield MXFP8, NEAREST, False
    for fmt in FP4:
        for rounding in (NEAREST, RBITS, PHILOX):
            for grid_amax in ((False, True) if fmt == NVFP4 else (False,)):
                yield fmt, rounding, grid_amax


def specializations():
    """Every (source, name expression) this module can launch."""
    for t in FLOATS.values():
        for fmt, rounding, grid_amax in _quant_kinds():
            yield SRC, quantize_expr(t, fmt, t.vector_width, True, rounding, grid_amax)
            yield SRC, quantize_expr(t, fmt, 2, False, rounding, grid_amax)
    for fmt, out, aligned in itertools.product((MXFP8, MXFP4, NVFP4), FLOATS.values(),
                                               (True, False)):
        yield SRC, dequant_expr(fmt, out, aligned)


_plans = _gpu.plan_table()


def swizzled_size(m: int, c: int) -> int:
    return 128 * -(-m // 128) * 4 * -(-c // 4)


class QuantizePlan:
    """A quantizer's launch: kernel, grid, outputs and the arguments after the pointers."""

    __slots__ = ("launch", "device", "grid", "outputs", "args", "ws", "amax_out", "kinds")

    def __init__(self, expr, device, grid, outputs, args, ws, amax_out, kinds):
        self.launch = _gpu.Launch(_kernels.function(SRC, expr, device), 19) if grid else None
        self.device, self.grid, self.outputs, self.args = device, grid, outputs, args
        self.ws, self.amax_out, self.kinds = ws, amax_out, kinds

    def __call__(self, stream, ptrs, rbits_ptr=0, amax_ptr=0, seed=0):
        outs, op = self.outputs.make(stream)
        ws = _gpu.workspace(self.device, stream) if self.ws else 0
        amax_out = op[2] if self.amax_out else 0
        self.launch(self.grid, THREADS, stream,
                    (ptrs[0], op[0], op[1], amax_out, rbits_ptr, amax_ptr, ws) + self.args
                    + (seed & 0xFFFFFFFF, seed >> 32))
        return outs


def _quantize_plan(key, t, fmt, m, k, aligned, scale_mode, swizzled, rounding, grid_amax,
                   amax_value, outputs, device):
    vec = t.vector_width if aligned else 2
    c = k // BLOCK[fmt]
    vpl, u = _shape(fmt, vec, rounding)
    nchunks = m * k // (vec * vpl)
    expr = quantize_expr(t, fmt, vec, aligned, rounding, grid_amax)
    grid = 0
    if nchunks:
        grid = -(-(-(-nchunks // (32 * u))) // (THREADS // 32))
        if fmt == NVFP4:
            # A block builds its table of 256 multipliers once and then takes many tiles.
            # The tensor amax's handshake needs the grid co-resident; a given amax's grid is
            # NV_WAVES waves of resident blocks (fewer where there is less work), the fewest
            # blocks that take the same rounds, so that none idles in the last one.
            fn = _kernels.function(SRC, expr, device)
            resident = _gpu.resident_blocks(fn, device, THREADS)
            if grid_amax:
                grid = min(grid, resident)
            else:
                grid = -(-grid // -(-grid // (NV_WAVES * resident)))
        else:
            grid = min(grid, 1 << 20)
    magic, shift = _gpu.fastdiv(max(c, 1))
    args = (nchunks, m, c, magic, shift, -(-c // 4), SCALE_MODES[scale_mode], int(swizzled),
            int(_INV_MAX[fmt].view(np.uint32)), _gpu.f32_bits(amax_value))
    return _gpu.remember(_plans, key, QuantizePlan(expr, device, grid, outputs, args, grid_amax,
                                                   fmt == NVFP4, None))


def _outputs(fmt, m, k, swizzled, amax_out, fp4x2=False):
    # Typed byte codes (uint8 in CuPy), so that torch's outputs have their dtypes however
    # the call is made, replayed or not; fp4x2: packed codes as torch.float4_e2m1fn_x2.
    c = k // BLOCK[fmt]
    codes = ((m, k // 2), _U8) if fmt in FP4 else ((m, k), E4M3.numpy)
    if fp4x2:
        codes += ("float4_e2m1fn_x2",)
    scale_type = E4M3.numpy if fmt == NVFP4 else E8M0.numpy
    scales = ((swizzled_size(m, c),), _U8) if swizzled else ((m, c), scale_type)
    return _gpu.Outputs(codes, scales, ((1,), _F32)) if amax_out else _gpu.Outputs(codes, scales)


def quantize_mx(stream, x, t: FloatType, fmt: int, scale_mode: str, scale_layout: str,
                rounding: int, rbits, seed: int, policy: KernelPolicy = DEFAULT_POLICY,
                fp4x2: bool = False):
    """MXFP8 / MXFP4 quantization of a 2-D x. Returns ((codes, scales), byte-code kinds).
    fp4x2: torch's codes as float4_e2m1fn_x2."""
    xc = contiguous(x)
    rb = None if rbits is None else contiguous(rbits)
    m, k = xc.shape
    swizzled = scale_layout == "swizzled"
    aligned = xc.data.ptr % 16 == 0 and (rb is None or rb.data.ptr % 16 == 0)
    key = ("mx", t.name, fmt, m, k, aligned, scale_mode, swizzled, rounding, policy.key,
           xc.data.device_id, fp4x2)
    plan = _plans.get(key)
    if plan is None:
        plan = _quantize_plan(key, t, fmt, m, k, aligned, scale_mode, swizzled, rounding, False,
                              0.0, _outputs(fmt, m, k, swizzled, False, fp4x2),
                              xc.data.device_id)
    kinds = (E4M3.numpy if fmt == MXFP8 else None, None if swizzled else E8M0.numpy)
    if not plan.grid:
        return plan.outputs.make(stream)[0], kinds
    if rounding == NEAREST and xc is x:
        offer(plan)
    elif rounding == RBITS and xc is x and rb is rbits:
        offer(lambda stream, ptrs: plan(stream, ptrs, ptrs[1]))
    elif rounding == PHILOX and xc is x:  # the seed is the replay's run-time value
        offer(lambda stream, ptrs, seed=seed: plan(stream, ptrs, 0, 0, seed))
    return plan(stream, (xc.data.ptr,), 0 if rb is None else rb.data.ptr, 0, seed), kinds


def quantize_nv(stream, x, t: FloatType, scale_layout: str, rounding: int, rbits, seed: int,
                amax_value, device_amax, policy: KernelPolicy = DEFAULT_POLICY,
                fp4x2: bool = False):
    """NVFP4 quantization of a 2-D x. Returns ((codes, scales, global_amax), kinds).
    fp4x2: torch's codes as float4_e2m1fn_x2."""
    xc = contiguous(x)
    rb = None if rbits is None else contiguous(rbits)
    m, k = xc.shape
    swizzled = scale_layout == "swizzled"
    aligned = xc.data.ptr % 16 == 0 and (rb is None or rb.data.ptr % 16 == 0)
    dynamic = amax_value is None and device_amax is None
    value = 0.0 if amax_value is None else float(amax_value)
    key = ("nv", t.name, m, k, aligned, swizzled, rounding, dynamic, device_amax is None,
           _gpu.f32_bits(value), policy.key, xc.data.device_id, fp4x2)
    plan = _plans.get(key)
    if plan is None:
        plan = _quantize_plan(key, t, NVFP4, m, k, aligned, "rceil", swizzled, rounding, dynamic,
                              value, _outputs(NVFP4, m, k, swizzled, device_amax is None, fp4x2),
                              xc.data.device_id)
        plan.amax_out = device_amax is None
    kinds = (None, None if swizzled else E4M3.numpy, None)
    if not plan.grid:
        outs = plan.outputs.make(stream)[0]
        if device_amax is None:
            amax = outs[2]
            if hasattr(amax, "fill_"):  # a torch tensor, made on torch's stream
                amax.fill_(float(value))
            else:
                amax.fill(np.float32(value))
            return outs, kinds
        return outs + (device_amax.reshape(1),), kinds
    rp = 0 if rb is None else rb.data.ptr
    if device_amax is not None:
        codes, scales = plan(stream, (xc.data.ptr,), rp, contiguous(device_amax).data.ptr, seed)
        return (codes, scales, device_amax.reshape(1)), kinds
    if xc is x and rounding == PHILOX:  # the seed is the replay's run-time value
        offer(lambda stream, ptrs, seed=seed: plan(stream, ptrs, 0, 0, seed))
    elif xc is x and rb is rbits:
        offer(plan if rb is None else (lambda stream, ptrs: plan(stream, ptrs, ptrs[1])))
    return plan(stream, (xc.data.ptr,), rp, 0, seed), kinds


class DequantizePlan:
    __slots__ = ("launch", "grid", "outputs", "args")

    def __init__(self, expr, device, grid, outputs, args):
        self.launch = _gpu.Launch(_kernels.function(SRC, expr, device), 11) if grid else None
        self.grid, self.outputs, self.args = grid, outputs, args

    def __call__(self, stream, ptrs, amax_ptr=0):
        (res,), (rp,) = self.outputs.make(stream)
        self.launch(self.grid, THREADS, stream, (ptrs[0], ptrs[1], rp, amax_ptr) + self.args)
        return res


def dequantize(stream, q, scales, global_amax, fmt: int, swizzled: bool, out: FloatType,
               policy: KernelPolicy = DEFAULT_POLICY):
    """codes [M, K] (MXFP8) or [M, K/2] (fp4) and scales in either layout to [M, K] of
    `out`. global_amax (NVFP4): (float32 value or None, device array or None)."""
    qc, sc = contiguous(q), contiguous(scales)
    m = qc.shape[0]
    k = qc.shape[1] * (2 if fmt in FP4 else 1)
    value, device_amax = global_amax if global_amax is not None else (0.0, None)
    value = 0.0 if value is None else float(value)
    aligned = qc.data.ptr % 16 == 0
    key = ("dq", fmt, out.name, m, k, swizzled, aligned, device_amax is None,
           _gpu.f32_bits(value), policy.key, qc.data.device_id)
    plan = _plans.get(key)
    if plan is None:
        c = k // BLOCK[fmt]
        nbytes = qc.size
        per_store = 16 // out.numpy.itemsize  # elements a unit: one 16-byte store
        units = nbytes // (per_store // 2 if fmt in FP4 else per_store)
        grid = min(-(-units // (THREADS * DEQUANT_UNROLL)), 1 << 20) if nbytes else 0
        magic, shift = _gpu.fastdiv(max(c, 1))
        plan = _gpu.remember(_plans, key, DequantizePlan(
            dequant_expr(fmt, out, aligned), qc.data.device_id, grid,
            _gpu.Outputs(((m, k), out.numpy)),
            (nbytes, c, magic, shift, -(-c // 4), int(swizzled), _gpu.f32_bits(value))))
    if not plan.grid:
        return plan.outputs.make(stream)[0], False
    if device_amax is not None:
        ga = contiguous(device_amax)
        if qc is q and sc is scales and ga is device_amax:
            offer(lambda stream, ptrs: plan(stream, ptrs, ptrs[2]))
        return (plan(stream, (qc.data.ptr, sc.data.ptr), ga.data.ptr),), False
    if qc is q and sc is scales:
        offer(plan)
    return (plan(stream, (qc.data.ptr, sc.data.ptr)),), False


__all__ = ["quantize_mx", "quantize_nv", "dequantize", "specializations", "MXFP8", "MXFP4",
           "NVFP4", "NEAREST", "RBITS", "PHILOX"]
