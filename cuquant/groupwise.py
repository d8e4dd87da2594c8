"""Group-wise integer quantization in DeepSpeed's format (SPEC section 5), INT4 per group
(TileOPs' INT4QuantPerGroupFwdOp), and batched dequantization.

Groups are runs of `group_size` consecutive elements of the C-order flattened tensor; any
group size that divides the size works. Per group, with lo/hi its minimum/maximum and
m = max|x|:

- symmetric: ``mult = 1 if m == 0 else f32(2**bits) / f32(2 m)``, params ``[1 / mult]``,
  ``q = clamp(rne(x * mult), -2**(bits-1), 2**(bits-1) - 1)``;
- asymmetric: ``mult = 1 if hi == lo else f32(2**bits) / (hi - lo)``,
  ``offset = (hi + lo) * 0.5``, params ``[1 / mult, offset]``,
  ``q = clamp(rne((x - offset) * mult), ...)``.

A NaN product gives code 0. 4-bit codes are packed two a byte, the first element of each
pair in the high nibble (int8 storage). Dequantization is ``dtype(f32(q) * p0)``
(symmetric) or ``dtype(f32(f32(q) * p0) + p1)`` (asymmetric).

This module also holds the GPU launchers of cuda_src/groups.cuh, which zero_point.py shares.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from . import _arrays, _fast, _gpu, _kernels, _numpy
from ._dtypes import FLOATS, INT4, INT8, FloatType
from ._numpy.groupwise import packed_shape, unpacked_shape
from ._op import HOST, contiguous, host_results, intake, out_dtype, run_gpu, same_place, stream_of, v

SRC = "groupwise.cu"
BITS = (4, 8)

__all__ = ["quantize_groupwise", "dequantize_groupwise", "dequantize_groupwise_batched",
           "quantize_int4_per_group", "dequantize_int4_per_group"]


# ---------------------------------------------------------------------------------------
# Argument checks shared with zero_point.py

def check_bits(bits, op: str, arg: str = "bits") -> int:
    b = v.check_int(bits, op, arg)
    v.check_choice(b, op, arg, BITS)
    return b


def check_bool(value, op: str, arg: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {arg} must be a bool (True or False); got {value!r}")
    return bool(value)


def check_group_size(group_size, op: str, n: int, what: str = "the size of x",
                     arg: str = "group_size") -> int:
    g = v.check_int(group_size, op, arg, minimum=1)
    if n % g:
        raise ValueError(f"{op}: {arg} must divide {what} ({n}); got {g}")
    return g


def check_even_last(a, op: str, arg: str, bits: int) -> None:
    shape = tuple(a.data.shape)
    if bits == 4 and (len(shape) == 0 or shape[-1] % 2):
        raise ValueError(f"{op}: {arg} must have an even last axis for bits=4 (two codes a "
                         f"byte); got shape {shape}")


def code_dtype(bits: int) -> np.dtype:
    """DeepSpeed codes: int8 storage for both widths (4-bit ones packed two a byte)."""
    return (INT4 if bits == 4 else INT8).numpy


def _code_input(a, op: str, arg: str, dtype) -> None:
    if a.data.dtype != dtype:
        raise TypeError(f"{op}: {arg} must be {np.dtype(dtype).name}; got {v.dtype_name(a)}")


# ---------------------------------------------------------------------------------------
# Geometry and specializations of the kernels in cuda_src/groups.cuh

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


# The staged quantizer (cuda_src/staged.cuh): a producer warp keeps `stages` shared-memory
# buffers of `stage_bytes` in flight with bulk copies while eight consumer warps quantize.
# Taken on sm_90 and up, on the fast path, for inputs of at least `min_bytes` whose groups
# fit one stage. Two 32 KB stages a block let three blocks share a multiprocessor: one stage
# in flight while the consumers work on the other, and three blocks' consumer warps to
# cover each other's arithmetic. Other stage sizes favour one width or build and lose on
# another, so one size serves all. Each thread holds `hold` units of a group (a caller's
# own choice, as the zero-point format makes, or else this table's): `hold_large` for groups of
# `large_units` units and more of 16-bit data. Groups of a size in `two_pass_units` (every
# divisor of 32 by default; the zero-point format picks its own by rounding) take the kernel
# that reduces a warp's groups first and writes their codes in a second pass over the
# stage, when `two_pass` is on.
STAGED = {"stage_bytes": 32 * 1024, "smem_per_block": 64 * 1024, "min_bytes": 1 << 20,
          "hold": 4, "hold_large": 8, "large_units": 64, "two_pass": True}
STAGED_THREADS = 288
STAGED_MAX_UNITS = 2048  # 256 threads x 8 units


def staged_device(device: int) -> bool:
    """Whether the device has bulk copies (sm_90 and up)."""
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
                  two_pass_units: tuple = TWO_PASS_UNITS) -> tuple:
    """The staged geometry for groups of `units` units of t: two passes for groups whose
    size is in `two_pass_units` (when STAGED["two_pass"]), else one pass with the caller's
    `hold` units a thread, or with hold 0 STAGED's choice (`hold_large` units a thread for
    large groups of 16-bit data, `hold` otherwise)."""
    if STAGED["two_pass"] and units in two_pass_units and 32 % units == 0:
        return two_pass_geometry(units)
    if not hold:
        large = units >= STAGED["large_units"] and t.numpy.itemsize == 2
        hold = STAGED["hold_large"] if large else STAGED["hold"]
    return staged_geometry(units, hold)


# The quantizer on tiles held in registers (quantize_groups_tiles in groups.cuh), for
# groups of `units` 16-byte units (divisors of 32) on the fast path, on every device and
# ahead of the staged kernel: a warp holds `units_per_lane` units a lane, reduces its
# groups by shuffles, prepares up to 32 groups at once (a lane each) and encodes from its
# registers, without the staged kernels' shared-memory ring: no producer warp, no barrier
# between a stage's arrival and its consumers, and a group's reduction in shuffles. 8 units
# a lane keep enough bytes in flight a warp; 16 would spill seeded rounding's registers.
# The grid: persistent for DeepSpeed's format (a warp takes many tiles, the next one
# loaded while it encodes the last, which hides the load behind the arithmetic); one tile
# a warp for the zero point, whose three outputs keep a warp's registers too busy for a
# second tile, so that more resident warps cover each other's waits instead
# (`persistent_tiles` of quantize_plan). "max_blocks" caps the grid (None: no cap), so
# that tests can make each warp take many tiles on small inputs.
TILES = {"on": True, "units": (2, 4, 8, 16, 32), "units_per_lane": 8, "max_blocks": None}
TILE_THREADS = 256
TILE_MAX_GROUPS = 64  # a tile's groups, as many as the kernel's shared-memory tables hold


def tile_geometry(units: int, units_per_lane: int = 0) -> tuple[int, int]:
    """(units a group, units a lane) of the tile kernel for groups of `units` units: the
    table's units a lane, or fewer where a tile would hold more than TILE_MAX_GROUPS."""
    k = units_per_lane or TILES["units_per_lane"]
    return units, min(k, TILE_MAX_GROUPS * units // 32)


def quant_tile_expr(fmt: str, t: FloatType, geom) -> str:
    upg, k = geom
    return f"cq::quantize_groups_tiles<{fmt}, {t.cxx}, {upg}, {k}>"


# The quantizer for small groups off the fast path (quantize_groups_small in groups.cuh):
# a block takes 256 groups, a thread each, through shared memory, where the general kernel
# reads a group with a team of threads an element each, whose loads are narrow and whose
# lanes idle while a group's statistics are reduced; here the block's elements come in
# with coalesced 16-byte loads and each thread works a whole group. Taken where a block's groups
# fit SMALL["smem"] bytes of shared memory (G <= 63 for 16-bit inputs, 38 for float32),
# without asking the device for more.
SMALL = {"on": True, "smem": 48 * 1024}
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
    tiles = tuple(tile_geometry(u) for u in TILES["units"]) if tiled else ()
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


def _ds_format(bits: int) -> str:
    return f"cq::DeepSpeed<{bits}>"


def _ds_codes(bits: int, symmetric: bool) -> str:
    return f"cq::DeepSpeedCodes<{bits}, {'true' if symmetric else 'false'}>"


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


def batched_expr(out: FloatType) -> str:
    return f"cq::dequantize_batched<{out.cxx}>"


def specializations():
    """Every (source, name expression) this module can launch."""
    yield from quant_specializations(SRC, _ds_format, FLOATS.values(), holds=(2, 4, 8),
                                     two_pass_units=TWO_PASS_UNITS)
    for bits, sym, out in itertools.product(BITS, (False, True), FLOATS.values()):
        for expr in dequant_kernels(_ds_codes(bits, sym), out, bits, DQ_UNROLL):
            yield SRC, expr
    for out in FLOATS.values():
        yield SRC, batched_expr(out)


# ---------------------------------------------------------------------------------------
# Launchers

_plans: dict = {}  # launch plans by problem (_gpu.remember keeps it bounded)


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
                  tile_fmt_of_bits=None):
    """The launch plan of quantize_groups over the C-contiguous x (n elements, n % g == 0),
    None when x is empty. The fast path needs g to be a multiple of a 16-byte unit and
    16-byte aligned x (and rbits); otherwise units are one byte of codes and a chunk is two
    groups when 4-bit groups are odd. The grid is persistent: at most the blocks that fit on
    the device at once; the tile kernel's too, unless `persistent_tiles` is false (one tile
    a warp). `hold` and `two_pass_units`: the staged kernel's geometry (staged_choice);
    `staged_fmt_of_bits`: the staged kernel's format, when not the other kernels' one;
    `tile_fmt_of_bits`: the tile kernel's, when not the staged kernel's.
    What a problem needs is worked out once (`_problem_plan`)."""
    n = x.size
    if n == 0:
        return None
    aligned = (x.data.ptr | (0 if rbits is None else rbits.data.ptr)) % 16 == 0
    # The format functions themselves are in the key: their names are only made on a miss.
    key = ("quant-problem", src, fmt_of_bits, staged_fmt_of_bits, tile_fmt_of_bits, bits,
           t.name, n, g, aligned, big, hold, two_pass_units, persistent_tiles, x.data.device_id)
    plan = _plans.get(key)
    if plan is None:
        fmt = fmt_of_bits(bits)
        staged_fmt = fmt if staged_fmt_of_bits is None else staged_fmt_of_bits(bits)
        tile_fmt = staged_fmt if tile_fmt_of_bits is None else tile_fmt_of_bits(bits)
        plan = _gpu.remember(_plans, key, _problem_plan(
            src, fmt, staged_fmt, tile_fmt, t, bits, n, g, aligned, big, hold, two_pass_units,
            persistent_tiles, x.data.device_id))
    return plan


class QuantizeRun:
    """One group-wise quantizer call from the stream and the input addresses (x's, and
    rbits' for caller-given words): its outputs made, then the plan's launch. The whole way
    runs it, and _fast keeps it as the replay of repeated calls."""

    __slots__ = ("outputs", "plan", "mode", "seed")

    def __init__(self, outputs, plan, mode: int, seed: int = 0):
        self.outputs, self.plan, self.mode, self.seed = outputs, plan, mode, seed

    def __call__(self, stream, ptrs):
        out = self.outputs.make()
        # Formats without a second parameter array or a reconstruction get null pointers.
        p1p, deqp = (out[2].data.ptr, out[3].data.ptr) if len(out) == 4 else (0, 0)
        launch, grid, threads, head, tail = self.plan
        seed = self.seed
        launch(grid, threads, stream,
               (ptrs[0], out[0].data.ptr, out[1].data.ptr, p1p, deqp,
                ptrs[1] if len(ptrs) > 1 else 0) + head
               + (self.mode, seed & 0xFFFFFFFF, seed >> 32) + tail)
        return out


def _problem_plan(src, fmt, staged_fmt, tile_fmt, t: FloatType, bits: int, n: int, g: int,
                  aligned: bool, big: bool, hold: int, two_pass_units: tuple,
                  persistent_tiles: bool, device: int):
    """(launch, grid, threads, arguments before the mode and seed, arguments after)."""
    vec = t.vector_width
    fast = g % vec == 0 and aligned
    if fast and _tiled(n // vec, g // vec):
        launch, threads, per_block, resident = _quant_tile_plan(src, tile_fmt, t, g // vec,
                                                                device)
        groups = n // g
        grid = _gpu.blocks_for(groups, per_block)
        if persistent_tiles:
            grid = min(grid, resident)
        if TILES["max_blocks"]:
            grid = min(grid, TILES["max_blocks"])
        return (launch, grid, threads, (groups, g), ())
    if fast and _staged(n * t.numpy.itemsize, t, g, device):
        launch, stages, stage_bytes, gpc, resident = _quant_staged_plan(
            src, staged_fmt, t, g, hold, two_pass_units, device)
        groups = n // g
        return (launch, min(_gpu.blocks_for(groups, gpc), resident), STAGED_THREADS, (groups, g),
                (gpc, stages, stage_bytes))
    if not fast and SMALL["on"] and small_smem_bytes(g, t.numpy.itemsize) <= SMALL["smem"]:
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


def _tiled(n_units: int, units: int) -> bool:
    """Whether the tile kernel takes n_units 16-byte units in groups of `units`: it is on,
    takes the group size, and the input fills at least one tile."""
    return (TILES["on"] and units in TILES["units"]
            and n_units >= 32 * tile_geometry(units)[1])


def _quant_tile_plan(src, fmt, t, units, device):
    """(launch, threads, groups a block takes at once, blocks resident at once) of the tile
    kernel, whose warps take tiles a grid apart."""
    geom = tile_geometry(units)
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


def _staged(nbytes: int, t: FloatType, g: int, device: int) -> bool:
    units = g // t.vector_width
    return (nbytes >= STAGED["min_bytes"] and g * t.numpy.itemsize <= STAGED["stage_bytes"]
            and units <= STAGED_MAX_UNITS and staged_device(device))


def _quant_staged_plan(src, fmt, t, g, hold, two_pass_units, device):
    key = ("quant-staged", src, fmt, t.name, g, hold, two_pass_units, device)
    plan = _plans.get(key)
    if plan is None:
        geom = staged_choice(g // t.vector_width, t, hold, two_pass_units)
        fn = _kernels.function(src, quant_staged_expr(fmt, t, geom), device)
        stage_bytes = STAGED["stage_bytes"]
        stages = max(1, min(8, STAGED["smem_per_block"] // stage_bytes))
        smem = stages * stage_bytes
        plan = _gpu.remember(_plans, key, (_gpu.Launch(fn, 14, smem), stages, stage_bytes,
                                           max(1, stage_bytes // (g * t.numpy.itemsize)),
                                           _gpu.resident_blocks(fn, device, STAGED_THREADS, smem)))
    return plan


# Units a dequantizing thread has in flight where each unit loads its own parameters: one
# leaves too few loads in flight, four cost registers and with them resident warps (in the
# spanning kernel too; also the batched kernel's BATCH_UNROLL in groupwise.cu).
DQ_UNROLL = 2
BATCH_ROUNDS = 8  # rounds of DQ_UNROLL units a thread of the batched kernel (groupwise.cu)
DQ_THREADS = 256
# Groups of at least WARP_MIN_UNITS 16-byte units of output share their parameters within
# a warp (dequant_warp_units in groups.cuh: 64 consecutive units a warp span at most 16
# groups), WARP_ROUNDS units a thread.
WARP_MIN_UNITS = 4
WARP_ROUNDS = 2


# Groups that are not whole 16-byte units of output keep units of 16 bytes
# (dequantize_groups_spanning) where the codes and parameters are aligned; tests switch it
# off to reach the general path.
SPANNING = {"on": True}


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
                    p1, unroll: int):
    """The launch plan of dequantize_groups for n elements of output from the codes q and
    parameters p0 (and p1), `unroll` units a thread."""
    qp, pp = q.data.ptr, p0.data.ptr
    key = ("dequant-problem", src, codes, out.name, bits, n, g, qp % 16,
           p1 is not None or pp % 8 == 0, unroll, q.data.device_id)
    plan = _plans.get(key)
    if plan is None:
        params = [p0] if p1 is None else []
        vec, units, d = dequant_units(n, g, bits, out, q, *params)
        if (vec != out.vector_width and SPANNING["on"]
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
    runs it, and _fast keeps it as the replay of repeated calls."""

    __slots__ = ("outputs", "plan")

    def __init__(self, outputs, plan):
        self.outputs, self.plan = outputs, plan

    def __call__(self, stream, ptrs):
        (res,) = self.outputs.make()
        launch, grid, tail = self.plan
        launch(grid, DQ_THREADS, stream,
               (ptrs[0], ptrs[1], ptrs[2] if len(ptrs) > 2 else 0, res.data.ptr) + tail)
        return res


def _cp():
    return _kernels.require_cupy("cuquant")


_F32 = np.dtype(np.float32)


def _gpu_quantize(stream, x, t, bits, sym, g):
    xc = contiguous(x)
    key = ("outputs", x.shape, bits, sym, g)
    outputs = _plans.get(key)
    if outputs is None:
        outputs = _gpu.remember(_plans, key, _gpu.Outputs(
            (packed_shape(x.shape, bits), code_dtype(bits)),
            ((x.size // g, 1 if sym else 2), _F32)))
    plan = quantize_plan(SRC, _ds_format, xc, t, bits, g)
    if plan is None:
        return outputs.make(), False
    run = QuantizeRun(outputs, plan, int(sym))
    if xc is x:
        _fast.offer(run)
    return run(stream, (xc.data.ptr,)), False


def _params_ready(p):
    """Parameters as the kernels read them: C-contiguous and 8-byte aligned."""
    p = contiguous(p)
    return p if p.data.ptr % 8 == 0 else p.copy()


def dequantize_to_new(stream, src: str, codes: str, out: FloatType, bits: int, g: int, q, p0,
                      p1, unroll: int, given: bool):
    """Dequantize the C-contiguous codes q into a new array (what _gpu.run expects back),
    `unroll` units a thread. `given`: q, p0 and p1 are the caller's own arrays (no copies),
    so the call's replay is offered (see _fast)."""
    key = ("dq-outputs", q.shape, bits, out.name)
    outputs = _plans.get(key)
    if outputs is None:
        outputs = _gpu.remember(_plans, key,
                                _gpu.Outputs((unpacked_shape(q.shape, bits), out.numpy)))
    n = math.prod(outputs.parts[0][0])
    if n == 0:
        return outputs.make(), False
    run = DequantizeRun(outputs, dequantize_plan(src, codes, out, bits, g, n, q, p0, p1, unroll))
    if given:
        _fast.offer(run)
    return (run(stream, (q.data.ptr, p0.data.ptr, 0 if p1 is None else p1.data.ptr)),), False


def _gpu_dequantize(stream, q, params, bits, sym, g, out):
    qc, pc = contiguous(q), _params_ready(params)
    return dequantize_to_new(stream, SRC, _ds_codes(bits, sym), out, bits, g, qc, pc, None,
                             DQ_UNROLL, qc is q and pc is params)


# ---------------------------------------------------------------------------------------
# Public ops

@_fast.replayable
def quantize_groupwise(x, bits, symmetric, group_size, *, stream=None):
    """Quantize groups of consecutive elements to 4- or 8-bit integers, DeepSpeed's format.

    Parameters
    ----------
    x : array, any shape, float16, bfloat16 or float32
        NumPy, CuPy, PyTorch, JAX or any DLPack array. Groups are runs of `group_size`
        elements of x flattened in C order.
    bits : {4, 8}
    symmetric : bool
        True: one multiplier per group from max|x|. False: a multiplier from the range
        ``hi - lo`` and an offset ``(hi + lo) / 2``.
    group_size : int >= 1
        Must divide ``x.size``; need not be a multiple of 8, nor <= 16384.
    stream : CuPy stream, torch.cuda.Stream or int, optional
        Stream of a GPU call; the current CuPy stream by default.

    Returns
    -------
    q : int8 array
        bits=8: shape of x, codes in [-128, 127]. bits=4: shape
        ``x.shape[:-1] + (x.shape[-1] // 2,)`` (the last axis of x must be even), two codes
        in [-8, 7] a byte, the first of each pair in the high nibble.
    params : float32 array [x.size // group_size, 1] (symmetric) or [..., 2] (asymmetric)
        ``[1 / mult]`` or ``[1 / mult, offset]`` per group: ``x ~= q * p0 (+ p1)``.
    """
    op = "quantize_groupwise"
    s = stream_of(stream, op)
    b = check_bits(bits, op)
    sym = check_bool(symmetric, op, "symmetric")
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    g = check_group_size(group_size, op, a.data.size)
    check_even_last(a, op, "x", b)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_groupwise(a.data, b, sym, g))
    return run_gpu(a, s, _gpu_quantize, a.data, t, b, sym, g)


def _dequant_checks(op, a, params, bits, symmetric, group_size, dtype, s, q_arg="q",
                    prefix=""):
    """Checks of a dequantizer whose codes `a` (taken in) are DeepSpeed codes; `prefix`
    names the item of a batch."""
    b = check_bits(bits, op, prefix + "bits")
    sym = check_bool(symmetric, op, prefix + "symmetric")
    out = out_dtype(dtype, op)
    _code_input(a, op, q_arg, code_dtype(b))
    if b == 4 and a.data.ndim == 0:
        raise ValueError(f"{op}: {q_arg} must have at least one axis for bits=4; got shape ()")
    n = a.data.size * (2 if b == 4 else 1)
    g = check_group_size(group_size, op, n, f"the element count of {q_arg}", prefix + "group_size")
    p_arg = prefix + "params"
    p = intake(params, op, p_arg, s)
    v.check_float(p, op, p_arg, {"float32": FLOATS["float32"]})
    v.check_shape(p, op, p_arg, (n // g, 1 if sym else 2),
                  f"[groups, {'1' if sym else '2'}] ({'symmetric' if sym else 'asymmetric'}, "
                  f"{n // g} groups of {g})")
    same_place(op, (q_arg, a), (p_arg, p))
    return b, sym, out, p, g


@_fast.replayable
def dequantize_groupwise(q, params, bits, symmetric, group_size, dtype, *, stream=None):
    """Dequantize the codes of `quantize_groupwise`.

    Parameters
    ----------
    q : int8 array
        bits=8: one code a byte; bits=4: two a byte, first element in the high nibble.
    params : float32 array [groups, 1] (symmetric) or [groups, 2] (asymmetric)
        groups = elements / group_size, elements = q.size (bits=8) or 2 * q.size (bits=4).
    bits : {4, 8}
    symmetric : bool
    group_size : int >= 1
    dtype : float16, bfloat16 or float32 (NumPy, ml_dtypes, torch or JAX dtype, or name)
    stream : optional

    Returns
    -------
    x : array of `dtype`
        Shape of q, the last axis doubled for bits=4. Symmetric ``dtype(f32(q) * p0)``,
        asymmetric ``dtype(f32(f32(q) * p0) + p1)``.
    """
    op = "dequantize_groupwise"
    s = stream_of(stream, op)
    a = intake(q, op, "q", s)
    b, sym, out, p, g = _dequant_checks(op, a, params, bits, symmetric, group_size, dtype, s)
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_groupwise(a.data, p.data, b, sym, g, out))
    return run_gpu(a, s, _gpu_dequantize, a.data, p.data, b, sym, g, out)


@_fast.replayable
def quantize_int4_per_group(w, group_size=128, *, stream=None):
    """TileOPs' INT4QuantPerGroupFwdOp: asymmetric 4-bit groups along K of a weight.

    Parameters
    ----------
    w : array [N, K], float16, bfloat16 or float32
        K must be even and a multiple of `group_size`.
    group_size : int >= 1, default 128
    stream : optional

    Returns
    -------
    packed : int8 array [N, K / 2]
        Codes in [-8, 7], the first of each pair in the high nibble.
    params : float32 array [N * K / group_size, 2]
        ``[1 / mult, offset]`` per group, row-major over (n, k // group_size).
    """
    op = "quantize_int4_per_group"
    s = stream_of(stream, op)
    a = intake(w, op, "w", s)
    t = v.check_float(a, op, "w")
    v.check_ndim(a, op, "w", 2, "[N, K]")
    k = a.data.shape[1]
    g = check_group_size(group_size, op, k, "K, the columns of w")
    check_even_last(a, op, "w", 4)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_int4_per_group(a.data, g))
    return run_gpu(a, s, _gpu_quantize, a.data, t, 4, False, g)


@_fast.replayable
def dequantize_int4_per_group(packed, params, dtype, group_size=128, *, stream=None):
    """Dequantize `quantize_int4_per_group`: ``dtype(f32(f32(q) * p0) + p1)``.

    Parameters
    ----------
    packed : int8 array [N, K / 2]
    params : float32 array [N * K / group_size, 2]
    dtype : float16, bfloat16 or float32
    group_size : int >= 1, default 128 (must divide K)
    stream : optional

    Returns
    -------
    w : array of `dtype`, [N, K]
    """
    op = "dequantize_int4_per_group"
    s = stream_of(stream, op)
    a = intake(packed, op, "packed", s)
    v.check_ndim(a, op, "packed", 2, "[N, K / 2]")
    k = 2 * a.data.shape[1]
    check_group_size(group_size, op, k, "K = 2 * packed.shape[1]")
    _, _, out, p, g = _dequant_checks(op, a, params, 4, False, group_size, dtype, s, q_arg="packed")
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_int4_per_group(a.data, p.data, out, g))
    return run_gpu(a, s, _gpu_dequantize, a.data, p.data, 4, False, g, out)


# ---------------------------------------------------------------------------------------
# Batched dequantization

_ITEM_KEYS = ("q", "params", "bits", "symmetric", "group_size")


def _item_fields(item, op: str, i: int):
    if isinstance(item, dict):
        missing = [k for k in _ITEM_KEYS if k not in item]
        if missing:
            raise ValueError(f"{op}: items[{i}] lacks {', '.join(missing)}; each item needs "
                             f"{', '.join(_ITEM_KEYS)}")
        return tuple(item[k] for k in _ITEM_KEYS)
    if isinstance(item, (tuple, list)) and len(item) == 5:
        return tuple(item)
    raise TypeError(f"{op}: items[{i}] must be a tuple (q, params, bits, symmetric, group_size) "
                    f"or a dict with those keys; got {type(item).__name__}"
                    + (f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""))


def dequantize_groupwise_batched(items, dtype, *, stream=None):
    """Dequantize many tensors of `quantize_groupwise` in one kernel launch.

    Parameters
    ----------
    items : sequence of (q, params, bits, symmetric, group_size) tuples, or of dicts with
        those keys
        Each item is what `dequantize_groupwise` takes; sizes, group sizes, bit widths and
        symmetries may all differ. Every q and params must live on one device (or all on
        the host).
    dtype : float16, bfloat16 or float32
        The output dtype of every item.
    stream : optional

    Returns
    -------
    list of arrays of `dtype`
        ``dequantize_groupwise(*item, dtype)`` for each item, in order, each in the array
        family of its q. On a GPU the whole list costs one kernel launch (plus one
        host-to-device copy of a small table of pointers and sizes).
    """
    op = "dequantize_groupwise_batched"
    batch = _batch_key(items, dtype) if stream is None else None
    if batch is not None:
        key, ptrs = batch
        replay = _fast.replay_of(key)
        if replay is not None and _fast.current_device() == key[1]:
            return replay(_fast.current_stream(), ptrs)
    if isinstance(items, (dict, str, bytes)) or not hasattr(items, "__len__"):
        raise TypeError(f"{op}: items must be a sequence of (q, params, bits, symmetric, "
                        f"group_size) items; got {type(items).__name__}")
    s = stream_of(stream, op)
    out = out_dtype(dtype, op)
    checked = []
    for i, item in enumerate(items):
        q, params, bits, symmetric, group_size = _item_fields(item, op, i)
        a = intake(q, op, f"items[{i}].q", s)
        b, sym, _, p, g = _dequant_checks(op, a, params, bits, symmetric, group_size, dtype, s,
                                          q_arg=f"items[{i}].q", prefix=f"items[{i}].")
        checked.append((a, p, b, sym, g))
    if not checked:
        return []
    first = checked[0][0]
    for i, (a, p, *_rest) in enumerate(checked[1:], 1):
        same_place(op, ("items[0].q", first), (f"items[{i}].q", a))
    if first.device == HOST:
        return [host_results(a, _numpy.dequantize_groupwise(a.data, p.data, b, sym, g, out))
                for a, p, b, sym, g in checked]
    return _gpu_batched(checked, out, s, batch)


def _batch_key(items, dtype):
    """(key, addresses) of a batch that can be replayed (see _fast): a list or tuple of
    (q, params, bits, symmetric, group_size) tuples of C-contiguous CuPy arrays on one
    device, with int bits and group size and a bool symmetry; None for any other batch. The
    key holds each item's shapes, dtypes, alignments and values, and the dtype argument."""
    nd = _fast.ND
    if nd is None or type(items) not in (list, tuple) or not items or not _fast.plain(dtype):
        return None
    parts, ptrs, device = [type(dtype), dtype], [], None
    for item in items:
        if type(item) is not tuple or len(item) != 5:
            return None
        q, p, bits, sym, g = item
        if (type(q) is not nd or type(p) is not nd or not q._c_contiguous or not p._c_contiguous
                or type(bits) is not int or type(sym) is not bool or type(g) is not int):
            return None
        qd, pd = q.data, p.data
        if device is None:
            device = qd.device_id
        if qd.device_id != device or pd.device_id != device:
            return None
        qp, pp = qd.ptr, pd.ptr
        parts += (q.shape, q.dtype, qp & 15, p.shape, p.dtype, pp & 15, bits, sym, g)
        ptrs.append((qp, pp))
    return (dequantize_groupwise_batched, device, tuple(parts)), ptrs  # key[1]: the device


class BatchRun:
    """One batched dequantization from the stream and each item's (q, params) addresses:
    each item's output allocated, the table of items (fixed fields kept, addresses filled
    in) copied to the device, one launch. The whole way runs it, and _fast keeps it as the
    replay of repeated batches."""

    __slots__ = ("outputs", "rows", "launch", "blocks")

    def __init__(self, outputs, rows, launch, blocks):
        # outputs: (shape, scalar type, bytes, row or -1) per item; rows: the table's rows
        # with 0 for the addresses.
        self.outputs, self.rows, self.launch, self.blocks = outputs, rows, launch, blocks

    def __call__(self, stream, ptrs):
        cp = _arrays.cupy_module()
        alloc, nd = cp.cuda.alloc, cp.ndarray
        results, table = [], list(self.rows)
        for (shape, typ, nbytes, row), (qp, pp) in zip(self.outputs, ptrs):
            res = nd(shape, typ, alloc(nbytes))
            results.append(res)
            if row >= 0:
                table[row] = (qp, pp, res.data.ptr) + table[row][3:]
        if table:
            t = cp.asarray(np.array(table, dtype=np.uint64).view(np.int64))
            self.launch(self.blocks, 256, stream, (t.data.ptr, len(table)))
        return results


def _gpu_batched(checked, out: FloatType, stream, batch=None):
    from ._arrays import outcome

    cp = _cp()
    device = checked[0][0].device
    with cp.cuda.Device(device):
        if stream is None:
            results = _run_batched(checked, out, cp.cuda.get_current_stream(), device, batch)
        else:
            with stream:
                results = _run_batched(checked, out, stream, device)
    return [outcome(a, r) for (a, *_rest), r in zip(checked, results)]


def _run_batched(checked, out, stream, device, batch=None):
    """Plan the whole list as one launch and run it; with `batch` (the key and addresses of
    a batch that can be replayed, `_batch_key`), the run is kept when every item was used
    as given."""
    rows, outputs, ptrs, held = [], [], [], []
    block = 0
    as_given = True
    for a, p, b, sym, g in checked:
        qc, pc = contiguous(a.data), _params_ready(p.data)
        as_given = as_given and qc is a.data and pc is p.data
        held.append((qc, pc))
        ptrs.append((qc.data.ptr, pc.data.ptr))
        shape = unpacked_shape(a.data.shape, b)
        n = math.prod(shape)
        outputs.append((shape, out.numpy.type, n * out.numpy.itemsize, len(rows) if n else -1))
        if n == 0:
            continue
        vec, units, d = dequant_units(n, g, b, out, qc, *([] if sym else [pc]))
        magic, shift = _gpu.fastdiv(d)
        kind = (1 if b == 4 else 0) | (2 if sym else 0) | (4 if vec > 2 else 0)
        rows.append((0, 0, 0, units, d, block, int(magic) | (int(shift) << 32), kind))
        block += -(-units // (DQ_THREADS * DQ_UNROLL * BATCH_ROUNDS))
    launch = None
    if rows:
        launch_key = ("batched", out.name, device)
        launch = _plans.get(launch_key)
        if launch is None:
            launch = _gpu.remember(_plans, launch_key, _gpu.Launch(
                _kernels.function(SRC, batched_expr(out), device), 2))
    run = BatchRun(tuple(outputs), tuple(rows), launch, block)
    if batch is not None and as_given and _fast.current_device() == device:
        _fast.keep(batch[0], run)
    # `held` keeps the copies made above (if any) alive until the launch is queued: freed
    # earlier, their memory could come back as this batch's outputs.
    results = run(stream, ptrs)
    del held
    return results


# ---------------------------------------------------------------------------------------
# Declarations for the GPU tests and the benchmark (cuquant/_registry.py)

GROUP_SIZES_SMALL = (1, 6, 24, 136, 128, 2048)   # all divide 104448 = 2**11 * 3 * 17
SHAPES_SMALL = ((51, 2048), (3, 4, 8704), (104448,), (2, 17, 3072))
LARGE_GROUPS = ((20000, ((3, 20000), (2, 5, 8000))), (65536, ((2, 65536), (4, 2, 16384))))
BENCH_GROUPS = (128, 2048)


def fit_shape(shape, group: int, even: bool, flat: bool = True) -> tuple:
    """`shape`, or, when `group` does not divide its size (flat) or its last axis, or the
    last axis is odd where it must be even, the shape with its last axis raised to the next
    multiple of lcm(group, 2 if even else 1): the generic GPU tests pass any shape."""
    shape = tuple(int(d) for d in shape) or (1,)
    size = int(np.prod(shape, dtype=np.int64))
    ok = (size if flat else shape[-1]) % group == 0 and not (even and shape[-1] % 2)
    if ok:
        return shape
    step = group * (2 if even and group % 2 else 1)
    return shape[:-1] + (max(step, -(-shape[-1] // step) * step),)


def _variants(groups, bits=BITS):
    return tuple({"bits": b, "symmetric": s, "group_size": g}
                 for g in groups for b in bits for s in (False, True))


def _make_quantize(xp, rng, shape, dtype, **kw):
    from ._registry import float_input

    shape = fit_shape(shape, kw["group_size"], kw["bits"] == 4)
    return (float_input(xp, rng, shape, dtype),), kw


def _make_dequantize(xp, rng, shape, dtype, **kw):
    from ._registry import float_input

    shape = fit_shape(shape, kw["group_size"], kw["bits"] == 4)
    q, params = quantize_groupwise(float_input(xp, rng, shape, np.float32), **kw)
    return (q, params, kw["bits"], kw["symmetric"], kw["group_size"], dtype), {}


def _make_int4(xp, rng, shape, dtype, group_size=128):
    from ._registry import float_input

    shape = fit_shape(shape if len(shape) == 2 else (1,) + tuple(shape)[-1:], group_size, True,
                      flat=False)
    return (float_input(xp, rng, shape, dtype),), {"group_size": group_size}


def _make_int4_dequant(xp, rng, shape, dtype, group_size=128):
    (w,), kw = _make_int4(xp, rng, shape, np.float32, group_size)
    q, params = quantize_int4_per_group(w, **kw)
    return (q, params, dtype), kw


def batched_inputs(xp, rng, count: int, max_elems: int, *, mixed: bool = True):
    """`count` (q, params, bits, symmetric, group_size) items of max_elems / 4 to max_elems
    elements each, both bit widths and symmetries, group sizes 128, 256 and 2048 (and
    24, 136 and 6 when `mixed`)."""
    from ._registry import float_input

    items = []
    groups = (128, 256, 2048) + ((24, 136, 6) if mixed else ())
    for i in range(count):
        g = groups[i % len(groups)]
        n = int(rng.integers(max(1, max_elems // 4), max_elems + 1))
        n = max(2 * g, (n // (2 * g)) * 2 * g)
        bits, sym = BITS[i % 2], bool((i // 2) % 2)
        x = float_input(xp, rng, (n // 64, 64) if n % 64 == 0 else (n,), np.float32)
        q, params = quantize_groupwise(x, bits, sym, g)
        items.append((q, params, bits, sym, g))
    return items


def _one_call_per_item(args, kwargs):
    """The batched op's work as one dequantize_groupwise call per tensor."""
    items, dtype = args
    return lambda: [dequantize_groupwise(*item, dtype) for item in items]


def _make_batched(xp, rng, shape, dtype, mixed=True):
    count, max_elems = shape[0], shape[-1]
    return (batched_inputs(xp, rng, count, max_elems, mixed=mixed), dtype), {}


def t_quantize_groupwise(x, bits, symmetric, group_size):
    """torch eager: the same math, not bit-exact (baseline only)."""
    import torch

    xf = x.float().reshape(-1, group_size)
    if symmetric:
        m = xf.abs().amax(dim=1, keepdim=True)
        mult = torch.where(m == 0, torch.ones_like(m), (2 ** bits) / (2 * m))
        offset = torch.zeros_like(m)
        params = 1 / mult
    else:
        hi, lo = xf.amax(dim=1, keepdim=True), xf.amin(dim=1, keepdim=True)
        mult = torch.where(hi == lo, torch.ones_like(hi), (2 ** bits) / (hi - lo))
        offset = (hi + lo) * 0.5
        params = torch.cat([1 / mult, offset], dim=1)
    q = ((xf - offset) * mult).round().clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    q = q.to(torch.int8).reshape(x.shape)
    if bits == 4:
        q = ((q[..., 0::2] << 4) | (q[..., 1::2] & 0xF)).to(torch.int8)
    return q, params


def t_dequantize_groupwise(q, params, bits, symmetric, group_size, dtype):
    import torch

    if bits == 4:
        q = torch.stack([q >> 4, (q << 4).to(torch.int8) >> 4], dim=-1).reshape(*q.shape[:-1], -1)
    y = q.float().reshape(-1, group_size) * params[:, :1]
    if not symmetric:
        y = y + params[:, 1:2]
    return y.to(dtype).reshape(q.shape)


def t_int4_per_group(w, group_size=128):
    return t_quantize_groupwise(w, 4, False, group_size)


def t_int4_dequant(packed, params, dtype, group_size=128):
    return t_dequantize_groupwise(packed, params, 4, False, group_size, dtype)


def _declare():
    from ._registry import BENCH_SHAPES, F, Op, extend

    fam = "groupwise"
    ops = []
    for bits, target in ((8, 0.92), (4, 0.90)):
        ops.append(Op("quantize_groupwise", fam, "quantize", F, _make_quantize,
                      variants=_variants(GROUP_SIZES_SMALL, (bits,)), shapes=SHAPES_SMALL,
                      bench_variants=_variants(BENCH_GROUPS, (bits,)), target=target,
                      torch_ref=t_quantize_groupwise, notes=f"{bits}-bit"))
    ops.append(Op("dequantize_groupwise", fam, "dequantize", F, _make_dequantize,
                  variants=_variants(GROUP_SIZES_SMALL), shapes=SHAPES_SMALL,
                  bench_variants=_variants(BENCH_GROUPS), target=0.93,
                  torch_ref=t_dequantize_groupwise))
    for g, shapes in LARGE_GROUPS:
        for fn, make, kind in (("quantize_groupwise", _make_quantize, "quantize"),
                               ("dequantize_groupwise", _make_dequantize, "dequantize")):
            ops.append(Op(fn, fam, kind, F, make, variants=_variants((g,)), shapes=shapes,
                          bench_shapes=(), bench_variants=(),
                          notes=f"group_size {g}, above DeepSpeed's 16384"))
    int4_shapes = ((1, 256), (7, 512), (64, 7168), (130, 4096))
    int4_variants = tuple({"group_size": g} for g in (32, 64, 128, 256, 6))
    ops.append(Op("quantize_int4_per_group", fam, "quantize", F, _make_int4,
                  variants=int4_variants, shapes=int4_shapes, bench_shapes=BENCH_SHAPES,
                  bench_variants=({"group_size": 128},), target=0.90, torch_ref=t_int4_per_group))
    ops.append(Op("dequantize_int4_per_group", fam, "dequantize", F, _make_int4_dequant,
                  variants=int4_variants, shapes=int4_shapes, bench_shapes=BENCH_SHAPES,
                  bench_variants=({"group_size": 128},), target=0.93, torch_ref=t_int4_dequant))
    ops.append(Op("dequantize_groupwise_batched", fam, "dequantize", F, _make_batched,
                  shapes=((5, 4096), (12, 70000)), bench_shapes=((64, 4 << 20),),
                  bench_variants=({"mixed": False},), target=0.93,
                  notes="shape = (tensors, max elements a tensor); the bench moves 64 "
                        "tensors of 1-4 MB of codes in one launch",
                  alternative=_one_call_per_item, alternative_name="one call per tensor"))
    extend(ops, bench_dtype="float16")  # the contract benchmarks group-wise at fp16


_declare()
