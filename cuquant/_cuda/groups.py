"""The group-wise kernel families of cuda_src/groups/, shared by every group-wise format
(DeepSpeed's in `groupwise`, the zero point's in `zero_point`): their geometries and name
expressions, the choice among them under a `KernelPolicy`, and the launch plans of the
quantizers and dequantizers. A format module names its source, its format policies and its
outputs; what a launch needs is worked out here once per distinct problem and kept in
`_plans`."""

from __future__ import annotations

import itertools
import math

from .._core.arrays import contiguous
from .._core.dtypes import FloatType
from .._core.replay import offer
from .._core.validate import BITS
from .._numpy.groupwise import unpacked_shape
from . import kernels as _kernels
from . import launch as _gpu
from .policy import DEFAULT_POLICY, KernelPolicy

# ---------------------------------------------------------------------------------------
# Geometry and specializations of the kernels in cuda_src/groups/

# (threads per team, units per thread, chunks per team and iteration); 0 units per thread
# streams a chunk (reads it twice). Fast-path units are 16 bytes of the input.
FAST_GEOMETRIES = (
    [(1 << i, 1, 4) for i in range(9)]                  # up to 256 units, one a thread
    + [(256, 2, 2), (256, 4, 1), (256, 8, 1)]           # up to 2048 units
    + [(1024, 4, 1), (1024, 8, 1)]                      # up to 8192 units
    + [(512, 0, 1)]                                     # longer: streamed
)
GENERAL_GEOMETRIES = [(1 << i, 1, 4) for i in range(9)] + [(256, 0, 1)]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def geometry(units: int, fast: bool, big: bool = True) -> tuple[int, int, int]:
    """The geometry for chunks of `units` units; `big`: 1024-thread teams allowed (formats
    whose out-of-line careful path fits the 64 registers such a block leaves a thread)."""
    if units <= 256:
        return (_pow2(units), 1, 4)
    if not fast:
        return (256, 0, 1)
    if units <= 2048:
        upt = _pow2(-(-units // 256))
        return (256, upt, 2 if upt == 2 else 1)
    if big and units <= 8192:
        return (1024, _pow2(-(-units // 1024)), 1)
    return (512, 0, 1)


def fast_geometries(big: bool = True):
    return [g for g in FAST_GEOMETRIES if big or g[0] != 1024]


def general_vec(bits: int) -> int:
    """Elements of a general-path unit: one byte of codes."""
    return 2 if bits == 4 else 1


def quant_expr(fmt: str, t: FloatType, vec: int, geom) -> str:
    tpg, upt, gpi = geom
    return f"cq::quantize_groups<{fmt}, {t.cxx}, {vec}, {tpg}, {upt}, {gpi}>"


# The staged quantizer (cuda_src/groups/staged.cuh, ring.cuh): a producer warp keeps
# `stages` shared-memory buffers of the policy's `stage_bytes` in flight with bulk copies
# while eight consumer warps quantize. Taken where the policy's `staged` allows (by default
# on sm_90 and up), on the fast path, for inputs of at least `staged_min_bytes` whose
# groups fit one stage (the reasons for the sizes are at KernelPolicy). Each thread holds
# `hold` units of a group (a format's own choice, as the zero-point format makes, or else
# the policy's). Groups of a size in `two_pass_units` (every divisor of 32 by default; the
# zero-point format picks its own by rounding) take the kernel that reduces a warp's groups
# first and writes their codes in a second pass over the stage, when the policy's
# `staged_two_pass` is on.
STAGED_THREADS = 288
STAGED_MAX_UNITS = 2048  # 256 threads x 8 units


def staged_device(device: int, policy: KernelPolicy = DEFAULT_POLICY) -> bool:
    """Whether the staged quantizer runs on the device: where it has bulk copies (sm_90 and
    up), unless the policy says everywhere or nowhere."""
    if policy.staged is not None:
        return policy.staged
    return int(_gpu.props(device)["cc"]) >= 90


def staged_geometry(units: int, hold: int = 4) -> tuple[int, int]:
    """(consumer threads per group, units a thread) of the staged quantizer for groups of
    `units` units: `hold` units a thread where the group allows."""
    if units <= hold:
        return 1, 1 << (units - 1).bit_length()
    team = min(256, 1 << (-(-units // hold) - 1).bit_length())
    return team, max(hold, 1 << (-(-units // team) - 1).bit_length())


def staged_geometries(holds) -> tuple:
    """Every staged geometry some group size takes with one of `holds`."""
    return tuple(sorted({staged_geometry(n, h) for h in holds
                         for n in range(1, STAGED_MAX_UNITS + 1)}))


def quant_staged_expr(fmt: str, t: FloatType, geom) -> str:
    """The staged kernel of a geometry: (team, units a thread) holds each group from its
    statistics to its codes, (team, units a thread, groups a team) takes two passes."""
    team, upt, iters = geom if len(geom) == 3 else geom + (0,)
    return f"cq::quantize_groups_staged<{fmt}, {t.cxx}, {team}, {upt}, {iters}>"


def two_pass_geometry(units: int) -> tuple[int, int, int]:
    """(team, units a thread, groups a team) of the two-pass staged quantizer for groups of
    `units` units, a divisor of 32: four units a thread, and a warp's groups 256 units in
    all (a 32 KB stage over the eight consumer warps)."""
    upt = min(4, units)
    team = units // upt
    return team, upt, max(1, min(32, 256 // units) // (32 // team))


TWO_PASS_UNITS = (1, 2, 4, 8, 16, 32)  # the group sizes the two-pass kernel takes: 32's divisors


def staged_choice(units: int, t: FloatType, hold: int = 0,
                  two_pass_units: tuple = TWO_PASS_UNITS,
                  policy: KernelPolicy = DEFAULT_POLICY) -> tuple:
    """The staged geometry for groups of `units` units of t: two passes for groups whose
    size is in `two_pass_units` (when the policy's `staged_two_pass`), else one pass with
    the caller's `hold` units a thread, or with hold 0 the policy's choice
    (`staged_hold_large` units a thread for large groups of 16-bit data, `staged_hold`
    otherwise)."""
    if policy.staged_two_pass and units in two_pass_units and 32 % units == 0:
        return two_pass_geometry(units)
    if not hold:
        large = units >= policy.staged_large_units and t.numpy.itemsize == 2
        hold = policy.staged_hold_large if large else policy.staged_hold
    return staged_geometry(units, hold)


# The quantizer on tiles held in registers (cuda_src/groups/tiles.cuh), for groups of the
# policy's `tile_units` 16-byte units (divisors of 32) on the fast path, on every device
# and ahead of the staged kernel: a warp holds `tile_units_per_lane` units a lane, reduces
# its groups by shuffles, prepares up to 32 groups at once (a lane each) and encodes from
# its registers, without the staged kernels' shared-memory ring: no producer warp, no
# barrier between a stage's arrival and its consumers, and a group's reduction in shuffles.
# 8 units a lane keep enough bytes in flight a warp; 16 would spill seeded rounding's
# registers. The grid: persistent for DeepSpeed's format (a warp takes many tiles, the next
# one loaded while it encodes the last, which hides the load behind the arithmetic); one
# tile a warp for the zero point, whose three outputs keep a warp's registers too busy for
# a second tile, so that more resident warps cover each other's waits instead
# (`persistent_tiles` of quantize_plan). The policy's `tile_max_blocks` caps the grid.
TILE_THREADS = 256
TILE_MAX_GROUPS = 64  # a tile's groups, as many as the kernel's shared-memory tables hold


def tile_geometry(units: int, units_per_lane: int = 0) -> tuple[int, int]:
    """(units a group, units a lane) of the tile kernel for groups of `units` units: the
    default policy's units a lane (or `units_per_lane`), or fewer where a tile would hold
    more than TILE_MAX_GROUPS."""
    k = units_per_lane or DEFAULT_POLICY.tile_units_per_lane
    return units, min(k, TILE_MAX_GROUPS * units // 32)


def quant_tile_expr(fmt: str, t: FloatType, geom) -> str:
    upg, k = geom
    return f"cq::quantize_groups_tiles<{fmt}, {t.cxx}, {upg}, {k}>"


# The quantizer for small groups off the fast path (cuda_src/groups/small.cuh):
# a block takes 256 groups, a thread each, through shared memory, where the general kernel
# reads a group with a team of threads an element each, whose loads are narrow and whose
# lanes idle while a group's statistics are reduced; here the block's elements come in
# with coalesced 16-byte loads and each thread works a whole group. Taken where a block's groups
# fit the policy's `small_smem` bytes of shared memory (G <= 63 for 16-bit inputs, 38 for float32),
# without asking the device for more.
SMALL_THREADS = 256


def small_smem_bytes(g: int, itemsize: int) -> int:
    """Shared memory of quantize_groups_small for groups of g elements: the 16-byte words
    of a chunk's elements and one more, then a byte a code, moved by up to 6 bytes."""
    return 16 * ((SMALL_THREADS * g * itemsize + 31) // 16) + SMALL_THREADS * g + 8


def quant_small_expr(fmt: str, t: FloatType) -> str:
    return f"cq::quantize_groups_small<{fmt}, {t.cxx}>"


def quant_specializations(src: str, fmt_of_bits, types, big: bool = True, holds=(2, 4),
                          two_pass_units: tuple = (), direct: bool = True, staged: bool = True,
                          tiled: bool = True):
    """The quantizer's specializations for a format: `holds`, the staged kernel's units a
    thread; `two_pass_units`, the group sizes (in 16-byte units) that take the two-pass
    staged kernel; `direct`, `staged` and `tiled`, whether the format serves the kernels
    that hold groups in registers, the staged kernels and the tile kernel."""
    staged = (staged_geometries(holds) + tuple(two_pass_geometry(u) for u in two_pass_units)
              if staged else ())
    tiles = tuple(tile_geometry(u) for u in DEFAULT_POLICY.tile_units) if tiled else ()
    for t, bits in itertools.product(types, BITS):
        if direct:
            for geom in fast_geometries(big):
                yield src, quant_expr(fmt_of_bits(bits), t, t.vector_width, geom)
            for geom in GENERAL_GEOMETRIES:
                yield src, quant_expr(fmt_of_bits(bits), t, general_vec(bits), geom)
            yield src, quant_small_expr(fmt_of_bits(bits), t)
        for geom in staged:
            yield src, quant_staged_expr(fmt_of_bits(bits), t, geom)
        for geom in tiles:
            yield src, quant_tile_expr(fmt_of_bits(bits), t, geom)


def dequant_expr(codes: str, out: FloatType, vec: int, unroll: int, warp_params: bool) -> str:
    return (f"cq::dequantize_groups<{codes}, {out.cxx}, {vec}, {unroll}, "
            f"{'true' if warp_params else 'false'}>")


def dequant_kernel(codes: str, out: FloatType, vec: int, d: int, unroll: int) -> tuple[str, int]:
    """(name expression, units a thread) of the dequantizer for units of `vec` elements and
    divisor d (`dequant_units`): on the fast path, groups of WARP_MIN_UNITS units or more
    share their parameters within a warp."""
    if vec == out.vector_width and d >= WARP_MIN_UNITS:
        return dequant_expr(codes, out, vec, WARP_ROUNDS, True), WARP_ROUNDS
    return dequant_expr(codes, out, vec, unroll, False), unroll


def dequant_spanning_expr(codes: str, out: FloatType, g: int, unroll: int) -> str:
    """The dequantizer of 16-byte units of output that may span groups (g not a multiple
    of the unit): each element its own group's parameters, of two groups at most a unit
    where g holds a unit, else of one group an element."""
    vec = out.vector_width
    return (f"cq::dequantize_groups_spanning<{codes}, {out.cxx}, {vec}, "
            f"{2 if g >= vec else vec}, {unroll}>")


def dequant_kernels(codes: str, out: FloatType, bits: int, unroll: int):
    """Every specialization `dequant_kernel` and `dequant_spanning_expr` can pick for one
    format and output type."""
    for vec, d in ((out.vector_width, WARP_MIN_UNITS), (out.vector_width, 1),
                   (general_vec(bits), 1)):
        yield dequant_kernel(codes, out, vec, d, unroll)[0]
    for g in (1, out.vector_width + 1):
        yield dequant_spanning_expr(codes, out, g, unroll)


# ---------------------------------------------------------------------------------------
# Launchers

_plans = _gpu.plan_table()  # launch plans by problem (_gpu.remember keeps it bounded)


def _quant_plan(src, fmt, t, vec, geom, device):
    key = ("quant", src, fmt, t.name, vec, geom, device)
    plan = _plans.get(key)
    if plan is None:
        fn = _kernels.function(src, quant_expr(fmt, t, vec, geom), device)
        threads = max(geom[0], 256)
        plan = _gpu.remember(_plans, key, (_gpu.Launch(fn, 12), threads,
                                           (threads // geom[0]) * geom[2],
                                           _gpu.resident_blocks(fn, device, threads)))
    return plan


def quantize_plan(src: str, fmt_of_bits, x, t: FloatType, bits: int, g: int, rbits=None,
                  big: bool = True, hold: int = 0, two_pass_units: tuple = TWO_PASS_UNITS,
                  staged_fmt_of_bits=None, persistent_tiles: bool = True,
                  tile_fmt_of_bits=None, policy: KernelPolicy = DEFAULT_POLICY):
    """The launch plan of quantize_groups over the C-contiguous x (n elements, n % g == 0),
    None when x is empty. The fast path needs g to be a multiple of a 16-byte unit and
    16-byte aligned x (and rbits); otherwise units are one byte of codes and a chunk is two
    groups when 4-bit groups are odd. The grid is persistent: at most the blocks that fit on
    the device at once; the tile kernel's too, unless `persistent_tiles` is false (one tile
    a warp). `hold` and `two_pass_units`: the staged kernel's geometry (staged_choice);
    `staged_fmt_of_bits`: the staged kernel's format, when not the other kernels' one;
    `tile_fmt_of_bits`: the tile kernel's, when not the staged kernel's; `policy`: the
    choice between kernels. What a problem needs is worked out once (`_problem_plan`)."""
    n = x.size
    if n == 0:
        return None
    aligned = (x.data.ptr | (0 if rbits is None else rbits.data.ptr)) % 16 == 0
    # The format functions themselves are in the key: their names are only made on a miss.
    key = ("quant-problem", src, fmt_of_bits, staged_fmt_of_bits, tile_fmt_of_bits, bits,
           t.name, n, g, aligned, big, hold, two_pass_units, persistent_tiles, policy.key,
           x.data.device_id)
    plan = _plans.get(key)
    if plan is None:
        fmt = fmt_of_bits(bits)
        staged_fmt = fmt if staged_fmt_of_bits is None else staged_fmt_of_bits(bits)
        tile_fmt = staged_fmt if tile_fmt_of_bits is None else tile_fmt_of_bits(bits)
        plan = _gpu.remember(_plans, key, _problem_plan(
            src, fmt, staged_fmt, tile_fmt, t, bits, n, g, aligned, big, hold, two_pass_units,
            persistent_tiles, x.data.device_id, policy))
    return plan


class QuantizeRun:
    """One group-wise quantizer call from the stream and the input addresses (x's, and
    rbits' for caller-given words) and, for seeded rounding, the seed (this call's own by
    default): its outputs made, then the plan's launch. The whole way runs it, and the
    replay cache keeps it as the replay of repeated calls."""

    __slots__ = ("outputs", "plan", "mode", "seed")

    def __init__(self, outputs, plan, mode: int, seed: int = 0):
        self.outputs, self.plan, self.mode, self.seed = outputs, plan, mode, seed

    def __call__(self, stream, ptrs, seed=None):
        out, op = self.outputs.make(stream)
        # Formats without a second parameter array or a reconstruction get null pointers.
        p1p, deqp = (op[2], op[3]) if len(op) == 4 else (0, 0)
        launch, grid, threads, head, tail = self.plan
        if seed is None:  # a replay's seed is given at run time; the whole way's is its own
            seed = self.seed
        launch(grid, threads, stream,
               (ptrs[0], op[0], op[1], p1p, deqp,
                ptrs[1] if len(ptrs) > 1 else 0) + head
               + (self.mode, seed & 0xFFFFFFFF, seed >> 32) + tail)
        return out


def _problem_plan(src, fmt, staged_fmt, tile_fmt, t: FloatType, bits: int, n: int, g: int,
                  aligned: bool, big: bool, hold: int, two_pass_units: tuple,
                  persistent_tiles: bool, device: int, policy: KernelPolicy = DEFAULT_POLICY):
    """(launch, grid, threads, arguments before the mode and seed, arguments after) of the
    kernel the policy picks: the tile kernel, the staged one, the small groups' one or the
    kernel that holds a group in registers (or streams it)."""
    vec = t.vector_width
    fast = g % vec == 0 and aligned
    if fast and _tiled(n // vec, g // vec, policy):
        launch, threads, per_block, resident = _quant_tile_plan(src, tile_fmt, t, g // vec,
                                                                device, policy)
        groups = n // g
        grid = _gpu.blocks_for(groups, per_block)
        if persistent_tiles:
            grid = min(grid, resident)
        if policy.tile_max_blocks:
            grid = min(grid, policy.tile_max_blocks)
        return (launch, grid, threads, (groups, g), ())
    if fast and _staged(n * t.numpy.itemsize, t, g, device, policy):
        launch, stages, stage_bytes, gpc, resident = _quant_staged_plan(
            src, staged_fmt, t, g, hold, two_pass_units, device, policy)
        groups = n // g
        return (launch, min(_gpu.blocks_for(groups, gpc), resident), STAGED_THREADS, (groups, g),
                (gpc, stages, stage_bytes))
    if not fast and policy.small and small_smem_bytes(g, t.numpy.itemsize) <= policy.small_smem:
        launch, resident = _quant_small_plan(src, fmt, t, g, device)
        groups = n // g
        return (launch, min(_gpu.blocks_for(groups, SMALL_THREADS), resident), SMALL_THREADS,
                (groups, g), ())
    if fast:
        length = g
    else:
        vec = general_vec(bits)
        length = 2 * g if (bits == 4 and g % 2) else g
    geom = geometry(length // vec, fast, big)
    launch, threads, per_block, resident = _quant_plan(src, fmt, t, vec, geom, device)
    chunks = n // length
    grid = min(_gpu.blocks_for(chunks, per_block), resident)
    return launch, grid, threads, (chunks, length, g), ()


def _tiled(n_units: int, units: int, policy: KernelPolicy = DEFAULT_POLICY) -> bool:
    """Whether the tile kernel takes n_units 16-byte units in groups of `units`: it is on,
    takes the group size, and the input fills at least one tile."""
    return (policy.tiles and units in policy.tile_units
            and n_units >= 32 * tile_geometry(units, policy.tile_units_per_lane)[1])


def _quant_tile_plan(src, fmt, t, units, device, policy: KernelPolicy = DEFAULT_POLICY):
    """(launch, threads, groups a block takes at once, blocks resident at once) of the tile
    kernel, whose warps take tiles a grid apart."""
    geom = tile_geometry(units, policy.tile_units_per_lane)
    key = ("quant-tiles", src, fmt, t.name, geom, device)
    plan = _plans.get(key)
    if plan is None:
        fn = _kernels.function(src, quant_tile_expr(fmt, t, geom), device)
        upg, k = geom
        plan = _gpu.remember(_plans, key, (
            _gpu.Launch(fn, 11), TILE_THREADS, (TILE_THREADS // 32) * (32 * k // upg),
            _gpu.resident_blocks(fn, device, TILE_THREADS)))
    return plan


def _quant_small_plan(src, fmt, t, g, device):
    """(launch, blocks resident at once) of quantize_groups_small for groups of g."""
    key = ("quant-small", src, fmt, t.name, g, device)
    plan = _plans.get(key)
    if plan is None:
        fn = _kernels.function(src, quant_small_expr(fmt, t), device)
        smem = small_smem_bytes(g, t.numpy.itemsize)
        plan = _gpu.remember(_plans, key, (_gpu.Launch(fn, 11, smem), _gpu.resident_blocks(
            fn, device, SMALL_THREADS, smem)))
    return plan


def _staged(nbytes: int, t: FloatType, g: int, device: int,
            policy: KernelPolicy = DEFAULT_POLICY) -> bool:
    units = g // t.vector_width
    return (nbytes >= policy.staged_min_bytes and g * t.numpy.itemsize <= policy.stage_bytes
            and units <= STAGED_MAX_UNITS and staged_device(device, policy))


def _quant_staged_plan(src, fmt, t, g, hold, two_pass_units, device,
                       policy: KernelPolicy = DEFAULT_POLICY):
    key = ("quant-staged", src, fmt, t.name, g, hold, two_pass_units, policy.key, device)
    plan = _plans.get(key)
    if plan is None:
        geom = staged_choice(g // t.vector_width, t, hold, two_pass_units, policy)
        fn = _kernels.function(src, quant_staged_expr(fmt, t, geom), device)
        stage_bytes = policy.stage_bytes
        stages = max(1, min(8, policy.staged_smem_per_block // stage_bytes))
        smem = stages * stage_bytes
        plan = _gpu.remember(_plans, key, (_gpu.Launch(fn, 14, smem), stages, stage_bytes,
                                           max(1, stage_bytes // (g * t.numpy.itemsize)),
                                           _gpu.resident_blocks(fn, device, STAGED_THREADS, smem)))
    return plan


# Units a dequantizing thread has in flight where each unit loads its own parameters: one
# leaves too few loads in flight, four cost registers and with them resident warps (in the
# spanning kernel too; also the batched kernel's BATCH_UNROLL in groupwise.cu).
DQ_UNROLL = 2
BATCH_ROUNDS = 8  # rounds of DQ_UNROLL units a thread of the batched kernel (groups/batched.cuh)
DQ_THREADS = 256
# Groups of at least WARP_MIN_UNITS 16-byte units of output share their parameters within
# a warp (dequant_warp_units in groups/dequantize.cuh: 64 consecutive units a warp span at most 16
# groups), WARP_ROUNDS units a thread.
WARP_MIN_UNITS = 4
WARP_ROUNDS = 2


def _units_aligned(bits: int, out: FloatType, q, params) -> bool:
    """Codes aligned to their bytes of a 16-byte unit of output, parameters to 8 bytes."""
    return (q.data.ptr % (out.vector_width * bits // 8) == 0
            and all(p.data.ptr % 8 == 0 for p in params))


def dequant_units(n: int, g: int, bits: int, out: FloatType, q, *params):
    """(vec, units, divisor) of a dequantization: the fast path (16 bytes of output a unit)
    wants g a multiple of the unit, codes aligned to their bytes of a unit and 8-byte
    aligned parameters."""
    vec = out.vector_width
    if g % vec == 0 and _units_aligned(bits, out, q, params):
        return vec, n // vec, g // vec
    vec = general_vec(bits)
    return vec, n // vec, g


def dequantize_plan(src: str, codes: str, out: FloatType, bits: int, g: int, n: int, q, p0,
                    p1, unroll: int, policy: KernelPolicy = DEFAULT_POLICY):
    """The launch plan of dequantize_groups for n elements of output from the codes q and
    parameters p0 (and p1), `unroll` units a thread. Groups that are not whole 16-byte units
    of output keep units of 16 bytes (dequantize_groups_spanning) where the codes and
    parameters are aligned, when the policy's `spanning`."""
    qp, pp = q.data.ptr, p0.data.ptr
    key = ("dequant-problem", src, codes, out.name, bits, n, g, qp % 16,
           p1 is not None or pp % 8 == 0, unroll, policy.key, q.data.device_id)
    plan = _plans.get(key)
    if plan is None:
        params = [p0] if p1 is None else []
        vec, units, d = dequant_units(n, g, bits, out, q, *params)
        if (vec != out.vector_width and policy.spanning
                and _units_aligned(bits, out, q, params)):
            # It takes the element count (its whole units, then the elements after them).
            expr = dequant_spanning_expr(codes, out, g, unroll)
            units, count, d = n // out.vector_width, n, g
        else:
            expr, unroll = dequant_kernel(codes, out, vec, d, unroll)
            count = units
        fn = _kernels.function(src, expr, q.data.device_id)
        grid = _gpu.blocks_for(units, DQ_THREADS * unroll)
        plan = _gpu.remember(_plans, key, (_gpu.Launch(fn, 8), grid,
                                           (count, d) + tuple(_gpu.fastdiv(d))))
    return plan


class DequantizeRun:
    """One group-wise dequantizer call from the stream and the addresses of the codes and
    one or two parameter arrays: its output made, then the plan's launch. The whole way
    runs it, and the replay cache keeps it as the replay of repeated calls."""

    __slots__ = ("outputs", "plan")

    def __init__(self, outputs, plan):
        self.outputs, self.plan = outputs, plan

    def __call__(self, stream, ptrs):
        (res,), (rp,) = self.outputs.make(stream)
        launch, grid, tail = self.plan
        launch(grid, DQ_THREADS, stream,
               (ptrs[0], ptrs[1], ptrs[2] if len(ptrs) > 2 else 0, rp) + tail)
        return res


def _params_ready(p):
    """Parameters as the kernels read them: C-contiguous and 8-byte aligned."""
    p = contiguous(p)
    return p if p.data.ptr % 8 == 0 else p.copy()


def dequantize_to_new(stream, src: str, codes: str, out: FloatType, bits: int, g: int, q, p0,
                      p1, unroll: int, given: bool, policy: KernelPolicy = DEFAULT_POLICY):
    """Dequantize the C-contiguous codes q into a new array (what _gpu.run expects back),
    `unroll` units a thread. `given`: q, p0 and p1 are the caller's own arrays (no copies),
    so the call's replay is offered (see cuquant._core.replay)."""
    key = ("dq-outputs", q.shape, bits, out.name)
    outputs = _plans.get(key)
    if outputs is None:
        outputs = _gpu.remember(_plans, key,
                                _gpu.Outputs((unpacked_shape(q.shape, bits), out.numpy)))
    n = math.prod(outputs.parts[0][0])
    if n == 0:
        return outputs.make(stream)[0], False
    run = DequantizeRun(outputs, dequantize_plan(src, codes, out, bits, g, n, q, p0, p1, unroll,
                                                 policy))
    if given:
        offer(run)
    return (run(stream, (q.data.ptr, p0.data.ptr, 0 if p1 is None else p1.data.ptr)),), False


