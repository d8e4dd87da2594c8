"""GPU side of symmetric scaled quantization (INT8 and FP8): picking the specialization of
cuda_src/symmetric.cu, allocating outputs and launching on the current stream.

Every launcher takes CuPy arrays that the public functions have already checked, and
returns the CuPy results. What a launch needs besides the arrays (the compiled kernel, the
geometry, run-time divisors) is worked out once per distinct problem and kept in `_plans`,
so a repeated call costs a dictionary lookup, the output allocations and the launch.
`specializations()` lists every kernel for the compile check."""

from __future__ import annotations

import functools
import itertools

import numpy as np

from .._core.arrays import contiguous, cupy_module
from .._core.dtypes import E4M3, FLOAT32, FLOATS, INT8, CodeType, FloatType
from .._core.replay import offer
from . import kernels as _kernels
from . import launch as _gpu
from .policy import DEFAULT_POLICY, KernelPolicy

SRC = "symmetric.cu"

# Scale rules (cuda_src/common/scale.cuh, ScaleRule); NO_EPS is the floor of rules without one.
ZERO_IS_ONE, FLOOR_EPS, FLOOR_EPS_POW2, ZERO_IS_ONE_POW2 = 0, 1, 2, 3
NO_EPS = np.float32(0)

TENSOR_CACHE = 4  # vectors per thread the per-tensor kernel keeps on chip

# (threads per group, vectors per thread). Four 16-byte vectors a thread for groups of up
# to 4096 vectors, one or two for groups that small; vectors per thread 0 streams a group
# too long to hold (read twice). A group of more than 128 vectors is held by a team of
# whole warps, the fewest of TEAM_WARPS that cover it: up to 1024 vectors, fewer than a
# warp's slots stay empty: a team sized to its row leaves no thread idle, where the next
# power of two would leave up to half of them so (a 7168-element bf16 row is 896 vectors,
# 7 warps). 14 warps gain nothing over 16 and are left out. SmoothQuant keeps teams of a
# power of two warps, whose blocks share its tables.
TEAM_WARPS = (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 28, 32)
POW2_WARPS = (2, 4, 8, 16, 32)


def geometries(exact_teams: bool = True) -> list[tuple[int, int]]:
    """Every geometry `geometry` can pick."""
    warps = TEAM_WARPS if exact_teams else POW2_WARPS
    return ([(1, 1), (1, 2)] + [(1 << i, 4) for i in range(6)] + [(32 * w, 4) for w in warps]
            + [(1024, 0)])


def geometry(nvec: int, exact_teams: bool = True) -> tuple[int, int]:
    """The geometry for groups of up to `nvec` vectors."""
    if nvec <= 2:
        return (1, max(nvec, 1))
    if nvec <= 128:
        return (1 << (-(-nvec // 4) - 1).bit_length(), 4)
    if nvec <= 4096:
        need = -(-nvec // 128)
        warps = TEAM_WARPS if exact_teams else POW2_WARPS
        return (32 * next(w for w in warps if w >= need), 4)
    return (1024, 0)


# smooth_quant_rows holds a row's float32 quotients. Large problems (from the policy's
# `smooth_wide_min_elements` on) give rows of more than 128 vectors the smallest
# power-of-two team that holds them at up to 7 vectors a thread (so 4-7; a 7168-element
# bf16 row is 128 threads x 7, no slot empty); 8 spill at the 128 registers a thread has
# with a multiprocessor's 512 threads in use. Other problems, and shorter rows, take
# `geometry`'s teams of up to 4 vectors, which finish a row sooner: with few rows a team,
# that wins.
SMOOTH_VECTORS_MAX = 7


def smooth_geometry(nvec: int, wide: bool = True) -> tuple[int, int]:
    """The geometry of smooth_quant_rows for rows of `nvec` vectors (at most 4096)."""
    if nvec <= 128 or not wide:
        return geometry(nvec, exact_teams=False)
    tpg = 1 << (-(-nvec // SMOOTH_VECTORS_MAX) - 1).bit_length()
    return (tpg, -(-nvec // tpg))


def smooth_threads(tpg: int, vpt: int) -> int:
    """Threads of a smooth_quant_rows block (SmoothShape in symmetric.cu), whose teams share
    the tables: teams of several warps at 5-7 vectors a thread (128 registers) fill a
    multiprocessor's 512 threads as one block; teams of a warp or less at 5-7 vectors go in
    blocks of 256, two a multiprocessor, and at 4 vectors (80 registers) three, except
    teams of 256, two to a block."""
    return tpg if tpg >= 512 else 512 if tpg == 256 or (vpt > 4 and tpg > 32) else 256


def smooth_geometries() -> list[tuple[int, int]]:
    """Every geometry `smooth_geometry` can pick (the narrow ones are among the wide)."""
    return sorted({smooth_geometry(n, w) for n in range(1, 4097) for w in (True, False)})


# (code, rule, smooth) combinations the public ops use.
ROW_GROUP_KINDS = (
    (INT8, ZERO_IS_ONE, False),      # per channel, per block
    (INT8, ZERO_IS_ONE, True),       # SmoothQuant
    (E4M3, FLOOR_EPS, False),        # per row, per token group
    (E4M3, FLOOR_EPS_POW2, False),   # per token group, ue8m0 scales
)


def _b(v: bool) -> str:
    return "true" if v else "false"


# The tile quantizer's scale rules: float32 scales, and UE8M0 scales (rounded up to a power
# of two).
TILE_RULES = (ZERO_IS_ONE, ZERO_IS_ONE_POW2)


# (code, rule) of the row kernels that can store their scales in the input's 16-bit type
# (scale_dtype): per channel, per row.
ROUNDED_SCALE_KINDS = ((INT8, ZERO_IS_ONE), (E4M3, FLOOR_EPS))


def row_groups_expr(t: FloatType, code: CodeType, rule: int, vec: int, geom, smooth: bool,
                    scale_type: FloatType = FLOAT32) -> str:
    tpg, vpt = geom
    ts = "" if scale_type is FLOAT32 else f", {scale_type.cxx}"
    return (f"cq::quantize_row_groups<{t.cxx}, {code.cxx}, {rule}, {vec}, {tpg}, {vpt}, "
            f"{_b(smooth)}{ts}>")


def smooth_full(k: int, vec: int, geom) -> bool:
    """Whether rows of k elements fill every vector of every thread of a team of whole
    warps: smooth_quant_rows then runs without a test a vector (FULL)."""
    tpg, vpt = geom
    return tpg >= 32 and k == tpg * vpt * vec


def smooth_expr(t: FloatType, vec: int, geom, full: bool) -> str:
    tpg, vpt = geom
    return f"cq::smooth_quant_rows<{t.cxx}, {vec}, {tpg}, {vpt}, {_b(full)}>"


def tensor_expr(t: FloatType, code: CodeType, vec: int) -> str:
    return f"cq::quantize_tensor<{t.cxx}, {code.cxx}, {vec}, {TENSOR_CACHE}>"


def static_expr(t: FloatType, code: CodeType, vec: int) -> str:
    return f"cq::quantize_static<{t.cxx}, {code.cxx}, {vec}>"


def tiles_expr(t: FloatType, code: CodeType, vec: int, rule: int = ZERO_IS_ONE) -> str:
    """The tile quantizer; its scale rule is a template parameter that defaults to
    ZERO_IS_ONE (float32 scales), ZERO_IS_ONE_POW2 for UE8M0 scales."""
    tail = "" if rule == ZERO_IS_ONE else f", {rule}"
    return f"cq::quantize_tiles<{t.cxx}, {code.cxx}, {vec}{tail}>"


# Where a dequantized element's scale is (cuda_src/symmetric.cu, ScaleMode).
PER_TENSOR, PER_ROW, PER_GROUP, PER_TILE = 0, 1, 2, 3


# Vectors in flight per dequantizing thread, by mode: two keep enough loads in flight; one
# where the scale is one value for the whole tensor.
DEQUANT_UNROLL = {PER_TENSOR: 1, PER_ROW: 2, PER_GROUP: 2, PER_TILE: 2}


def dequant_expr(code: CodeType, out: FloatType, vec: int, mode: int) -> str:
    return f"cq::dequantize_scaled<{code.cxx}, {out.cxx}, {vec}, {mode}, {DEQUANT_UNROLL[mode]}>"


def specializations():
    """Every (source, name expression) this module can launch."""
    for t in FLOATS.values():
        for vec in (t.vector_width, 1):
            for code, rule, smooth in ROW_GROUP_KINDS:
                for geom in geometries(exact_teams=not smooth):
                    yield SRC, row_groups_expr(t, code, rule, vec, geom, smooth)
            if t is not FLOAT32:
                for code, rule in ROUNDED_SCALE_KINDS:
                    for geom in geometries():
                        yield SRC, row_groups_expr(t, code, rule, vec, geom, False, t)
            if vec > 1:
                for geom in smooth_geometries():
                    for full in (False, True) if geom[0] >= 32 else (False,):
                        yield SRC, smooth_expr(t, vec, geom, full)
            for code in (INT8, E4M3):
                yield SRC, tensor_expr(t, code, vec)
                yield SRC, static_expr(t, code, vec)
            for rule in TILE_RULES:
                yield SRC, tiles_expr(t, E4M3, vec, rule)
    for code, out, mode in itertools.product((INT8, E4M3), FLOATS.values(),
                                             (PER_TENSOR, PER_ROW, PER_GROUP, PER_TILE)):
        for vec in (out.vector_width, 1):
            yield SRC, dequant_expr(code, out, vec, mode)


_plans = _gpu.plan_table()  # launch plans by problem (_gpu.remember keeps it bounded)


_U8, _I8, _F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.float32)


def _code_dtype(code: CodeType) -> np.dtype:
    """An output's dtype of codes: CuPy makes fp8 codes as uint8, torch as float8_e4m3fn."""
    return E4M3.numpy if code is E4M3 else _I8


def _fill(a, value: float) -> None:
    """Fill an output of either family (empty inputs' scales)."""
    if hasattr(a, "fill_"):
        a.fill_(value)
    else:
        a.fill(value)


class Plan:
    """Everything a launch needs besides the arrays' addresses: the kernel, the grid, the
    outputs' layout and the remaining arguments. grid 0: nothing to launch. Its methods do
    one call of each kind from the stream and the input addresses; the replay cache keeps
    them as the replays of repeated calls."""

    __slots__ = ("launch", "grid", "threads", "outputs", "args", "column_rows", "ws", "device")

    def __init__(self, expr, device, nargs, grid, threads, outputs, args, smem=0):
        # The kernel is compiled only when there is work (empty inputs need none).
        self.launch = (_gpu.Launch(_kernels.function(SRC, expr, device), nargs, smem) if grid
                       else None)
        self.grid, self.threads, self.outputs, self.args = grid, threads, outputs, args
        self.column_rows = 0  # rows of a column-layout scale (0: row layout)
        self.ws = False  # smooth_quant_rows: the stream's zeroed workspace as the last argument
        self.device = device

    def rows(self, stream, ptrs):
        """Row groups of x (ptrs: x, and smooth for SmoothQuant): (q, scale)."""
        (q, buf), (qp, bp) = self.outputs.make(stream)
        ws = (_gpu.workspace(self.device, stream),) if self.ws else ()
        self.launch(self.grid, self.threads, stream,
                    (ptrs[0], qp, bp, ptrs[1] if len(ptrs) > 1 else 0) + self.args + ws)
        return q, (buf[:, :self.column_rows].T if self.column_rows else buf)

    def tensor(self, stream, ptrs):
        """Dynamic per-tensor (ptrs: x): (q, scale)."""
        (q, scale), (qp, sp) = self.outputs.make(stream)
        n, inv_qmax = self.args
        self.launch(self.grid, 256, stream,
                    (ptrs[0], qp, sp, n, _gpu.workspace(self.device, stream), inv_qmax))
        return q, scale

    def static(self, scale_bits, stream, ptrs):
        """Per-tensor with a host scale, given as its float32 bits (ptrs: x): (q, scale)."""
        (q, scale), (qp, sp) = self.outputs.make(stream)
        self.launch(self.grid, 256, stream, (ptrs[0], qp, 0, scale_bits, sp) + self.args)
        return q, scale

    def tiles(self, stream, ptrs):
        """128x128 tiles of w (ptrs: w): (q, scale)."""
        (q, scale), (qp, sp) = self.outputs.make(stream)
        self.launch(self.grid, 256, stream, (ptrs[0], qp, sp) + self.args)
        return q, scale

    def dequantize(self, stream, ptrs):
        """ptrs: q, scale. Returns x."""
        (res,), (rp,) = self.outputs.make(stream)
        self.launch(self.grid, 256, stream, (ptrs[0], ptrs[1], rp) + self.args)
        return res


# ---------------------------------------------------------------------------------------
# Launchers

def row_threads(tpg: int) -> int:
    """Threads a block of the row-group kernel has (RowGroupShape in symmetric.cu): teams
    of tpg that divide 256 share a block of 256, other teams are a block each."""
    return tpg if tpg >= 256 or 256 % tpg else 256


# SmoothQuant problems smaller than the policy's `smooth_rows_min_elements` take the general
# row kernel: each block of smooth_quant_rows first builds its tables of smooth and
# 1 / smooth, which small calls do not earn back.


def smooth_shared_bytes(k: int, threads: int, geom) -> int:
    """Shared memory of smooth_quant_rows: K reciprocals and K negated factors, then a 16-byte
    slot per thread and vector for the next row."""
    return 2 * -(-k // 4) * 16 + threads * geom[1] * 16


def _smooth_plan(key, t, code, rows, k, vec, geom, threads, smem, device):
    """SmoothQuant rows held on chip (smooth_quant_rows): a persistent grid, each block
    keeping -smooth and 1 / smooth in shared memory for all the rows it takes. Small
    problems, rows that are not 16-byte vectors, rows too long to hold and rows whose tables
    do not fit take the general row kernel."""
    outputs = _gpu.Outputs(((rows, k), _I8), ((rows,), _F32))
    expr = smooth_expr(t, vec, geom, smooth_full(k, vec, geom))
    plan = Plan(expr, device, 8, 1, threads, outputs, (rows, k, code.inv_qmax_bits), smem=smem)
    plan.ws = True  # rows dealt from a counter in the stream's workspace (some geometries)
    plan.grid = min(_gpu.blocks_for(rows, threads // geom[0]),
                    _gpu.resident_blocks(plan.launch.fn, device, threads, smem))
    return _gpu.remember(_plans, key, plan)


def _row_groups_plan(key, t, code, rule, rows, k, group, aligned, smooth, eps_bits, layout,
                     q_shape, scale_shape, scale_type, device,
                     policy: KernelPolicy = DEFAULT_POLICY):
    vec = t.vector_width if aligned and k % t.vector_width == 0 else 1
    gpr = -(-k // group)
    nvec = -(-min(group, k) // vec)
    geom = geometry(nvec, exact_teams=not smooth)
    threads = row_threads(geom[0])
    if smooth and vec > 1 and geom[1] and rows * k >= max(policy.smooth_rows_min_elements, 1):
        sgeom = smooth_geometry(nvec, rows * k >= policy.smooth_wide_min_elements)
        sthreads = smooth_threads(*sgeom)
        smem = smooth_shared_bytes(k, sthreads, sgeom)
        if smem <= _gpu.props(device)["smem_optin"]:
            return _smooth_plan(key, t, code, rows, k, vec, sgeom, sthreads, smem, device)
    magic, shift = _gpu.fastdiv(gpr)
    q_shape = q_shape if q_shape is not None else (rows, k)
    if layout == "column":
        m4 = -(-rows // 4) * 4
        outputs = _gpu.Outputs((q_shape, _code_dtype(code)), ((gpr, m4), _F32))
        srs, sgs, pad = 1, m4, m4 - rows
    else:
        outputs = _gpu.Outputs((q_shape, _code_dtype(code)),
                               (scale_shape if scale_shape is not None else (rows, gpr),
                                scale_type.numpy))
        srs, sgs, pad = gpr, 1, 0
    grid = min(-(-(rows * gpr) // max(threads // geom[0], 1)), 1 << 20) if rows and k else 0
    plan = Plan(row_groups_expr(t, code, rule, vec, geom, smooth, scale_type), device, 15, grid,
                threads,
                outputs, (rows, k, group, gpr, magic, shift, srs, sgs, pad, code.inv_qmax_bits,
                          eps_bits))
    plan.column_rows = rows if layout == "column" else 0
    return _gpu.remember(_plans, key, plan)


def quantize_row_groups(stream, x, t: FloatType, code: CodeType, rule: int, group: int,
                        eps_bits: int = 0, smooth=None, scale_layout: str = "row",
                        scale_shape=None, q_shape=None, scale_type: FloatType = FLOAT32,
                        policy: KernelPolicy = DEFAULT_POLICY):
    """x: C-contiguous [rows, K]. Returns (q [rows, K], scale [rows, ceil(K/group)]) where
    scale is a strided view of a [groups, round_up(rows, 4)] buffer for layout "column"
    (its padding rows zero); `q_shape` and `scale_shape` allocate the outputs in other
    shapes of the same sizes. eps_bits is the float32 floor of FLOOR_EPS rules, as bits.
    `scale_type` other than float32 (t itself, for ROUNDED_SCALE_KINDS) stores the scales
    rounded to it, the codes computed against them."""
    rows, k = x.shape
    xp = x.data.ptr
    sp = 0 if smooth is None else smooth.data.ptr
    key = ("rows", t.name, code.name, rule, rows, k, group, (xp | sp) % 16 == 0,
           smooth is not None, eps_bits, scale_layout, q_shape, scale_shape, scale_type.name,
           policy.key, x.data.device_id)
    plan = _plans.get(key)
    if plan is None:
        plan = _row_groups_plan(key, t, code, rule, rows, k, group, (xp | sp) % 16 == 0,
                                smooth is not None, eps_bits, scale_layout, q_shape, scale_shape,
                                scale_type, x.data.device_id, policy)
    if not plan.grid:
        q, buf = plan.outputs.make(stream)[0]
        return q, (buf[:, :rows].T if scale_layout == "column" else buf)
    offer(plan.rows)
    return plan.rows(stream, (xp, sp))


def quantize_tensor(stream, x, t: FloatType, code: CodeType):
    """Dynamic per-tensor: x C-contiguous, any shape. Returns (q, scale [1])."""
    xp = x.data.ptr
    device = x.data.device_id
    key = ("tensor", t.name, code.name, x.shape, xp % 16 == 0, device)
    plan = _plans.get(key)
    if plan is None:
        vec = t.vector_width if xp % 16 == 0 else 1
        n, expr, grid = x.size, tensor_expr(t, code, vec), 0
        if n:  # a co-resident grid (the kernel's grid-wide handshake needs one)
            fn = _kernels.function(SRC, expr, device)
            grid = max(1, min(-(-(n // vec) // 256), _gpu.resident_blocks(fn, device, 256)))
        plan = _gpu.remember(_plans, key, Plan(expr, device, 6, grid, 256,
                                   _gpu.Outputs((x.shape, _code_dtype(code)), ((1,), _F32)),
                                   (n, code.inv_qmax_bits)))
    if not plan.grid:
        q, scale = plan.outputs.make(stream)[0]
        _fill(scale, 1.0)
        return q, scale
    offer(plan.tensor)
    return plan.tensor(stream, (xp,))


def quantize_static(stream, x, t: FloatType, code: CodeType, scale_value=None, scale_array=None):
    """Per-tensor with a given scale: a float, or a device float32 array of one element."""
    xp = x.data.ptr
    device = x.data.device_id
    given = scale_array is not None
    key = ("static", t.name, code.name, x.shape, xp % 16 == 0, given, device)
    plan = _plans.get(key)
    if plan is None:
        vec = t.vector_width if xp % 16 == 0 else 1
        n = x.size
        specs = ((x.shape, _code_dtype(code)),) + (() if given else (((1,), _F32),))
        grid = min(-(-(n // vec + 1) // 1024), 1 << 20) if n else 0
        plan = _gpu.remember(_plans, key, Plan(static_expr(t, code, vec), device, 6, grid, 256,
                                   _gpu.Outputs(*specs), (n,)))
    if given:
        (q,), (qp,) = plan.outputs.make(stream)
        if plan.grid:
            plan.launch(plan.grid, 256, stream,
                        (xp, qp, scale_array.data.ptr, 0, 0) + plan.args)
        return q, scale_array.reshape(1)
    if not plan.grid:
        q, scale_out = plan.outputs.make(stream)[0]
        _fill(scale_out, float(np.float32(scale_value)))
        return q, scale_out
    replay = functools.partial(plan.static, _f32_bits(scale_value))
    offer(replay)
    return replay(stream, (xp,))


def quantize_tiles(stream, w, t: FloatType, code: CodeType, rule: int = ZERO_IS_ONE):
    """128x128 tiles of w [N, K] under a scale rule of TILE_RULES. Returns (q, scale
    [ceil(N/128), ceil(K/128)])."""
    wp = w.data.ptr
    device = w.data.device_id
    key = ("tiles", t.name, code.name, rule, w.shape, wp % 16 == 0, device)
    plan = _plans.get(key)
    if plan is None:
        n, k = w.shape
        tn, tk = -(-n // 128), -(-k // 128)
        vec = t.vector_width
        if k % vec or wp % 16:
            vec = 1
        grid = min(tn * tk, 1 << 20) if n and k else 0
        plan = _gpu.remember(_plans, key, Plan(tiles_expr(t, code, vec, rule), device, 8, grid, 256,
                                   _gpu.Outputs(((n, k), _code_dtype(code)), ((tn, tk), _F32)),
                                   (n, k, tn, tk, code.inv_qmax_bits)))
    if not plan.grid:
        return plan.outputs.make(stream)[0]
    offer(plan.tiles)
    return plan.tiles(stream, (wp,))


def dequantize(stream, q, rows: int, k: int, scale, code: CodeType, out: FloatType, mode: int,
               group: int = 0, given: bool = False):
    """q: C-contiguous codes of any shape, read as [rows, K]; scale: float32, one element
    (PER_TENSOR), `rows` values in C order (PER_ROW), [rows, ceil(K/group)] (PER_GROUP) or
    [ceil(rows/128), ceil(K/128)] (PER_TILE), any strides. Returns an array shaped like q.
    Each thread writes 16 bytes of output per vector. `given`: q and scale are the caller's
    own arrays (no copies), so the call can be replayed."""
    qp = q.data.ptr
    strides = scale.strides if mode >= PER_GROUP else None
    key = ("dequant", code.name, out.name, q.shape, rows, k, mode, group, strides, qp % 16,
           q.data.device_id)
    plan = _plans.get(key)
    if plan is None:
        srs, scs = (1, 0) if strides is None else (strides[0] // 4, strides[-1] // 4)
        vec = out.vector_width
        if k % vec or qp % vec:
            vec = 1
        kv = k // vec
        grid = min(-(-(rows * kv) // (256 * DEQUANT_UNROLL[mode])), 1 << 20) if rows and k else 0
        plan = _gpu.remember(_plans, key, Plan(
            dequant_expr(code, out, vec, mode), q.data.device_id, 10, grid, 256,
            _gpu.Outputs((q.shape, out.numpy)),
            (rows, kv) + _gpu.fastdiv(kv) + (max(group, 1).bit_length() - 1, srs, scs)))
    if not plan.grid:
        return plan.outputs.make(stream)[0][0]
    if given:
        offer(plan.dequantize)
    return plan.dequantize(stream, (qp, scale.data.ptr))


# ---------------------------------------------------------------------------------------
# What the public ops hand to _gpu.run: (arrays, whether the first holds fp8 codes).

def run_tensor(stream, x, t: FloatType, code: CodeType, value=None, device_scale=None):
    """Per-tensor quantization, dynamic (no scale given) or static."""
    if value is None and device_scale is None:
        return quantize_tensor(stream, contiguous(x), t, code), code is E4M3
    return quantize_static(stream, contiguous(x), t, code, value, device_scale), code is E4M3


def run_rows(stream, x, t: FloatType, code: CodeType, rule: int, eps=NO_EPS, smooth=None,
             scale_type: FloatType = FLOAT32, policy: KernelPolicy = DEFAULT_POLICY):
    """One group per row of the last axis (any rank); the scale has shape x.shape[:-1], of
    `scale_type` (float32, or t for ROUNDED_SCALE_KINDS)."""
    shape = x.shape
    k = shape[-1]
    if k == 0:  # an empty row's amax is 0
        from .._numpy import _core

        fill = (_core.scale_zero_is_one(np.zeros(1, np.float32), code) if rule == ZERO_IS_ONE
                else _core.scale_floor(np.zeros(1, np.float32), eps, code))
        cp = cupy_module()
        return (cp.empty(shape, dtype=_U8 if code is E4M3 else _I8),
                cp.full(shape[:-1], fill.astype(scale_type.numpy)[0], dtype=scale_type.numpy)
                ), code is E4M3
    x = contiguous(x)
    return quantize_row_groups(stream, x if len(shape) == 2 else x.reshape(-1, k), t, code, rule,
                               k, _f32_bits(eps), None if smooth is None else contiguous(smooth),
                               "row", shape[:-1], shape, scale_type, policy), code is E4M3


def _f32_bits(v) -> int:
    """A float32 argument's bits, remembered (packing them costs half a microsecond)."""
    bits = _bits_cache.get(v)
    return bits if bits is not None else _gpu.remember(_bits_cache, v, _gpu.f32_bits(v))


_bits_cache: dict = {}


def run_groups(stream, x, t: FloatType, code: CodeType, rule: int, group: int,
               eps=NO_EPS, scale_layout: str = "row"):
    """Groups of `group` elements along the rows of a 2-D x."""
    return quantize_row_groups(stream, contiguous(x), t, code, rule, group, _f32_bits(eps), None,
                               scale_layout), code is E4M3


def run_tiles(stream, w, t: FloatType, code: CodeType, rule: int = ZERO_IS_ONE):
    return quantize_tiles(stream, contiguous(w), t, code, rule), code is E4M3


def run_dequantize(stream, q, scale, code: CodeType, out: FloatType, granularity: str,
                   group: int = 0):
    """Dequantize q of any shape. granularity: "tensor" (scale of one element), "row"
    (scale shaped q.shape[:-1]), "group" (scale [M, ceil(K/group)], any strides) or "tile"
    (scale [ceil(N/128), ceil(K/128)])."""
    qc = contiguous(q)
    sc = contiguous(scale) if granularity == "row" else scale
    if granularity == "tensor":
        rows, k, mode = 1, q.size, PER_TENSOR
    elif granularity == "row":
        k = q.shape[-1]
        rows, mode = (q.size // k if k else 0), PER_ROW
    else:
        (rows, k), mode = q.shape, PER_GROUP if granularity == "group" else PER_TILE
    return (dequantize(stream, qc, rows, k, sc, code, out, mode, group,
                       given=qc is q and sc is scale),), False


__all__ = ["run_tensor", "run_rows", "run_groups", "run_tiles", "run_dequantize",
           "quantize_row_groups", "quantize_tensor", "quantize_static", "quantize_tiles",
           "dequantize", "specializations", "geometry", "ZERO_IS_ONE", "FLOOR_EPS",
           "FLOOR_EPS_POW2", "ZERO_IS_ONE_POW2"]
