"""GPU side of symmetric scaled quantization (INT8 and FP8): picking the specialization of
cuda_src/symmetric.cu, allocating outputs and launching on the current stream.

Every launcher takes CuPy arrays that the public functions have already checked, and
returns the CuPy results. What a launch needs besides the arrays (the compiled kernel, the
geometry, run-time divisors) is worked out once per distinct problem and kept in `_plans`,
so a repeated call costs a dictionary lookup, the output allocations and the launch.
`specializations()` lists every kernel for the compile check."""

from __future__ import annotations

import itertools

import numpy as np

from . import _gpu, _kernels
from ._arrays import cupy_module
from ._dtypes import E4M3, FLOATS, INT8, CodeType, FloatType

SRC = "symmetric.cu"

# Scale rules (cuda_src/common.cuh, ScaleRule)
ZERO_IS_ONE, FLOOR_EPS, FLOOR_EPS_POW2 = 0, 1, 2

TENSOR_CACHE = 4  # vectors per thread the per-tensor kernel keeps on chip

# (threads per group, vectors per thread): four 16-byte vectors a thread for groups of up
# to 4096 vectors (measured fastest on an H200: for 7168-element rows 0.83 of copy against
# 0.80 with eight a thread and 0.66 with two); one or two for groups that small. Vectors
# per thread 0 means the group is streamed (read twice).
def geometries() -> list[tuple[int, int]]:
    """Every geometry `geometry` can pick."""
    return [(1, 1), (1, 2)] + [(1 << i, 4) for i in range(11)] + [(1024, 0)]


def geometry(nvec: int) -> tuple[int, int]:
    """The geometry for groups of up to `nvec` vectors."""
    if nvec <= 2:
        return (1, max(nvec, 1))
    if nvec <= 4096:
        return (1 << (-(-nvec // 4) - 1).bit_length(), 4)
    return (1024, 0)


# (code, rule, smooth) combinations the public ops use.
ROW_GROUP_KINDS = (
    (INT8, ZERO_IS_ONE, False),      # per channel, per block
    (INT8, ZERO_IS_ONE, True),       # SmoothQuant
    (E4M3, FLOOR_EPS, False),        # per row, per token group
    (E4M3, FLOOR_EPS_POW2, False),   # per token group, ue8m0 scales
)


def vector_width(t: FloatType) -> int:
    """Elements of t in one 16-byte access."""
    return 16 // t.numpy.itemsize


def _b(v: bool) -> str:
    return "true" if v else "false"


def row_groups_expr(t: FloatType, code: CodeType, rule: int, vec: int, geom, smooth: bool) -> str:
    tpg, vpt = geom
    return f"cq::quantize_row_groups<{t.cxx}, {code.cxx}, {rule}, {vec}, {tpg}, {vpt}, {_b(smooth)}>"


def tensor_expr(t: FloatType, code: CodeType, vec: int) -> str:
    return f"cq::quantize_tensor<{t.cxx}, {code.cxx}, {vec}, {TENSOR_CACHE}>"


def static_expr(t: FloatType, code: CodeType, vec: int) -> str:
    return f"cq::quantize_static<{t.cxx}, {code.cxx}, {vec}>"


def tiles_expr(t: FloatType, code: CodeType, vec: int) -> str:
    return f"cq::quantize_tiles<{t.cxx}, {code.cxx}, {vec}>"


# Where a dequantized element's scale is (cuda_src/symmetric.cu, ScaleMode).
PER_TENSOR, PER_ROW, PER_GROUP, PER_TILE = 0, 1, 2, 3


# Vectors in flight per dequantizing thread, by mode (measured fastest on an H200).
DEQUANT_UNROLL = {PER_TENSOR: 1, PER_ROW: 2, PER_GROUP: 2, PER_TILE: 2}


def dequant_expr(code: CodeType, out: FloatType, vec: int, mode: int) -> str:
    return f"cq::dequantize_scaled<{code.cxx}, {out.cxx}, {vec}, {mode}, {DEQUANT_UNROLL[mode]}>"


def specializations():
    """Every (source, name expression) this module can launch."""
    for t in FLOATS.values():
        for vec in (vector_width(t), 1):
            for code, rule, smooth in ROW_GROUP_KINDS:
                for geom in geometries():
                    yield SRC, row_groups_expr(t, code, rule, vec, geom, smooth)
            for code in (INT8, E4M3):
                yield SRC, tensor_expr(t, code, vec)
                yield SRC, static_expr(t, code, vec)
            yield SRC, tiles_expr(t, E4M3, vec)
    for code, out, mode in itertools.product((INT8, E4M3), FLOATS.values(),
                                             (PER_TENSOR, PER_ROW, PER_GROUP, PER_TILE)):
        for vec in (16 // out.numpy.itemsize, 1):
            yield SRC, dequant_expr(code, out, vec, mode)


_plans: dict = {}


_U8, _I8, _F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.float32)


def _code_dtype(code: CodeType) -> np.dtype:
    return _U8 if code is E4M3 else _I8


def _contiguous(x):
    return x if x.flags.c_contiguous else cupy_module().ascontiguousarray(x)


# ---------------------------------------------------------------------------------------
# Launchers

def _row_groups_plan(t, code, rule, k, group, vec, smooth, device):
    gpr = -(-k // group)
    geom = geometry(-(-min(group, k) // vec))
    fn = _kernels.function(SRC, row_groups_expr(t, code, rule, vec, geom, smooth), device)
    threads = max(geom[0], 256)
    return _gpu.Launch(fn, 15), threads, threads // geom[0], gpr, _gpu.fastdiv(gpr)


def quantize_row_groups(stream, x, t: FloatType, code: CodeType, rule: int, group: int,
                        eps_bits: int = 0, smooth=None, scale_layout: str = "row",
                        scale_shape=None, q_shape=None):
    """x: C-contiguous [rows, K]. Returns (q [rows, K], scale [rows, ceil(K/group)]) where
    scale is a strided view of a [groups, round_up(rows, 4)] buffer for layout "column";
    `q_shape` and `scale_shape` allocate the outputs in other shapes of the same sizes.
    eps_bits is the float32 floor of FLOOR_EPS rules, as bits."""
    rows, k = x.shape
    vec = 16 // t.numpy.itemsize
    if k % vec or x.data.ptr % 16 or (smooth is not None and smooth.data.ptr % 16):
        vec = 1
    device = x.data.device_id
    key = ("rows", t.name, code.name, rule, k, group, vec, smooth is None, device)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _row_groups_plan(t, code, rule, k, group, vec, smooth is not None,
                                              device)
    launch, threads, per_block, gpr, (magic, shift) = plan
    q_shape = q_shape if q_shape is not None else (rows, k)
    if scale_layout == "column":
        m4 = -(-rows // 4) * 4
        q, buf = _gpu.empty_pair(q_shape, _code_dtype(code), (gpr, m4), _F32)
        scale = buf[:, :rows].T
        srs, sgs, pad = 1, m4, m4 - rows
    else:
        q, buf = _gpu.empty_pair(q_shape, _code_dtype(code),
                                 scale_shape if scale_shape is not None else (rows, gpr), _F32)
        scale = buf
        srs, sgs, pad = gpr, 1, 0
    if rows == 0 or k == 0:
        if pad:
            buf.fill(0)
        return q, scale
    launch(min(-(-(rows * gpr) // per_block), 1 << 20), threads, stream,
           (x.data.ptr, q.data.ptr, buf.data.ptr, 0 if smooth is None else smooth.data.ptr, rows,
            k, group, gpr, magic, shift, srs, sgs, pad, code.inv_qmax_bits, eps_bits))
    return q, scale


def quantize_tensor(stream, x, t: FloatType, code: CodeType):
    """Dynamic per-tensor: x C-contiguous, any shape. Returns (q, scale [1])."""
    q, scale = _gpu.empty_pair(x.shape, _code_dtype(code), (1,), _F32)
    n = x.size
    if n == 0:
        scale.fill(1.0)
        return q, scale
    device = x.data.device_id
    vec = 16 // t.numpy.itemsize if x.data.ptr % 16 == 0 else 1
    key = ("tensor", t.name, code.name, vec, device)
    plan = _plans.get(key)
    if plan is None:
        fn = _kernels.function(SRC, tensor_expr(t, code, vec), device)
        plan = _plans[key] = (_gpu.Launch(fn, 6), _gpu.resident_blocks(fn, device, 256))
    launch, resident = plan
    grid = max(1, min(-(-(n // vec) // 256), resident))
    launch(grid, 256, stream, (x.data.ptr, q.data.ptr, scale.data.ptr, n,
                               _gpu.workspace(device, stream).data.ptr, code.inv_qmax_bits))
    return q, scale


def quantize_static(stream, x, t: FloatType, code: CodeType, scale_value=None, scale_array=None):
    """Per-tensor with a given scale: a float, or a device float32 array of one element."""
    cp = cupy_module()
    if scale_array is None:
        q, scale_out = _gpu.empty_pair(x.shape, _code_dtype(code), (1,), _F32)
        ptr, value, out = 0, _gpu.f32_bits(scale_value), scale_out.data.ptr
    else:
        q = cp.empty(x.shape, dtype=_code_dtype(code))
        scale_out = scale_array.reshape(1)
        ptr, value, out = scale_array.data.ptr, 0, 0
    n = x.size
    if n == 0:
        if scale_array is None:
            scale_out.fill(np.float32(scale_value))
        return q, scale_out
    device = x.data.device_id
    vec = 16 // t.numpy.itemsize if x.data.ptr % 16 == 0 else 1
    key = ("static", t.name, code.name, vec, device)
    launch = _plans.get(key)
    if launch is None:
        launch = _plans[key] = _gpu.Launch(_kernels.function(SRC, static_expr(t, code, vec), device), 6)
    launch(min(-(-(n // vec + 1) // 1024), 1 << 20), 256, stream,
           (x.data.ptr, q.data.ptr, ptr, value, out, n))
    return q, scale_out


def quantize_tiles(stream, w, t: FloatType, code: CodeType):
    """128x128 tiles of w [N, K]. Returns (q, scale [ceil(N/128), ceil(K/128)])."""
    n, k = w.shape
    tn, tk = -(-n // 128), -(-k // 128)
    q, scale = _gpu.empty_pair((n, k), _code_dtype(code), (tn, tk), _F32)
    if n == 0 or k == 0:
        return q, scale
    vec = 16 // t.numpy.itemsize
    if k % vec or w.data.ptr % 16:
        vec = 1
    device = w.data.device_id
    key = ("tiles", t.name, code.name, vec, device)
    launch = _plans.get(key)
    if launch is None:
        launch = _plans[key] = _gpu.Launch(_kernels.function(SRC, tiles_expr(t, code, vec), device), 8)
    launch(min(tn * tk, 1 << 20), 256, stream,
           (w.data.ptr, q.data.ptr, scale.data.ptr, n, k, tn, tk, code.inv_qmax_bits))
    return q, scale


def dequantize(stream, q, rows: int, k: int, scale, code: CodeType, out: FloatType, mode: int,
               group: int = 0):
    """q: C-contiguous codes of any shape, read as [rows, K]; scale: float32, one element
    (PER_TENSOR), `rows` values in C order (PER_ROW), [rows, ceil(K/group)] (PER_GROUP) or
    [ceil(rows/128), ceil(K/128)] (PER_TILE), any strides. Returns an array shaped like q.
    Each thread writes 16 bytes of output per vector."""
    res = cupy_module().empty(q.shape, dtype=out.numpy)
    if rows == 0 or k == 0:
        return res
    if mode == PER_TENSOR or mode == PER_ROW:
        srs, scs = 1, 0
    else:
        strides = scale.strides
        srs, scs = strides[0] // 4, strides[-1] // 4
    vec = 16 // out.numpy.itemsize
    if k % vec or q.data.ptr % vec:
        vec = 1
    kv = k // vec
    device = q.data.device_id
    key = ("dequant", code.name, out.name, vec, mode, kv, device)
    plan = _plans.get(key)
    if plan is None:
        fn = _kernels.function(SRC, dequant_expr(code, out, vec, mode), device)
        plan = _plans[key] = (_gpu.Launch(fn, 10),) + _gpu.fastdiv(kv) + (256 * DEQUANT_UNROLL[mode],)
    launch, magic, shift, per_block = plan
    launch(min(-(-(rows * kv) // per_block), 1 << 20), 256, stream,
           (q.data.ptr, scale.data.ptr, res.data.ptr, rows, kv, magic, shift,
            max(group, 1).bit_length() - 1, srs, scs))
    return res


# ---------------------------------------------------------------------------------------
# What the public ops hand to _gpu.run: results paired with "holds fp8 codes".

def _flag(code: CodeType, q, scale):
    return (q, code is E4M3), (scale, False)


def run_tensor(stream, x, t: FloatType, code: CodeType, value=None, device_scale=None):
    """Per-tensor quantization, dynamic (no scale given) or static."""
    if value is None and device_scale is None:
        return _flag(code, *quantize_tensor(stream, _contiguous(x), t, code))
    return _flag(code, *quantize_static(stream, _contiguous(x), t, code, value, device_scale))


def run_rows(stream, x, t: FloatType, code: CodeType, rule: int, eps=np.float32(0), smooth=None):
    """One group per row of the last axis (any rank); the scale has shape x.shape[:-1]."""
    shape = x.shape
    k = shape[-1]
    if not x.flags.c_contiguous:
        x = cupy_module().ascontiguousarray(x)
    if k == 0:  # an empty row's amax is 0
        from ._numpy import _core

        fill = (_core.scale_zero_is_one(np.zeros(1, np.float32), code) if rule == ZERO_IS_ONE
                else _core.scale_floor(np.zeros(1, np.float32), eps, code))[0]
        q = cupy_module().empty(shape, dtype=_code_dtype(code))
        return _flag(code, q, cupy_module().full(shape[:-1], fill, dtype=np.float32))
    x2 = x if x.ndim == 2 else x.reshape(-1, k)
    q, scale = quantize_row_groups(stream, x2, t, code, rule, k, _eps_bits(eps),
                                   None if smooth is None else _contiguous(smooth),
                                   scale_shape=shape[:-1], q_shape=shape)
    return _flag(code, q, scale)


def _eps_bits(eps) -> int:
    bits = _eps_cache.get(eps)
    if bits is None:
        bits = _eps_cache[eps] = _gpu.f32_bits(eps)
    return bits


_eps_cache: dict = {}


def run_groups(stream, x, t: FloatType, code: CodeType, rule: int, group: int,
               eps=np.float32(0), scale_layout: str = "row"):
    """Groups of `group` elements along the rows of a 2-D x."""
    return _flag(code, *quantize_row_groups(stream, _contiguous(x), t, code, rule, group,
                                            _eps_bits(eps), scale_layout=scale_layout))


def run_tiles(stream, w, t: FloatType, code: CodeType):
    return _flag(code, *quantize_tiles(stream, _contiguous(w), t, code))


def run_dequantize(stream, q, scale, code: CodeType, out: FloatType, granularity: str,
                   group: int = 0):
    """Dequantize q of any shape. granularity: "tensor" (scale of one element), "row"
    (scale shaped q.shape[:-1]), "group" (scale [M, ceil(K/group)], any strides) or "tile"
    (scale [ceil(N/128), ceil(K/128)])."""
    qc = _contiguous(q)
    if granularity == "tensor":
        res = dequantize(stream, qc, 1, q.size, scale, code, out, PER_TENSOR)
    elif granularity == "row":
        k = q.shape[-1]
        s1 = scale if scale.flags.c_contiguous else _contiguous(scale)
        res = dequantize(stream, qc, q.size // k if k else 0, k, s1, code, out, PER_ROW)
    else:
        rows, k = q.shape
        res = dequantize(stream, qc, rows, k, scale, code, out,
                         PER_GROUP if granularity == "group" else PER_TILE, group)
    return ((res, False),)


__all__ = ["run_tensor", "run_rows", "run_groups", "run_tiles", "run_dequantize",
           "quantize_row_groups", "quantize_tensor", "quantize_static", "quantize_tiles",
           "dequantize", "specializations", "geometry", "ZERO_IS_ONE", "FLOOR_EPS",
           "FLOOR_EPS_POW2"]
