"""What every GPU launch needs: the stream, the device's properties, per-stream workspaces,
and run-time divisors. Imported lazily by the ops, only when a CUDA array arrives."""

from __future__ import annotations

import ctypes
import math
import struct
import threading

import numpy as np

from .._core import replay as _replay
from .._core.arrays import HOST, cupy_module, outcome, require_cupy

_props: dict = {}
_workspaces: dict = {}
_occupancy: dict = {}
_lock = threading.Lock()

NULL = np.uint64(0)  # a null pointer argument



def run(like, stream, fn, *args):
    """Call fn(cupy_stream, *args) on the device of `like` with `stream` current (kernels
    launch on the current stream), and hand its results back in the caller's family. fn
    returns (arrays, fp8): a tuple of CuPy arrays, and whether the first holds fp8 codes, or
    a tuple naming each array's byte-code dtype (a NumPy dtype, or None)."""
    if stream is None and _get_device() == like.device:
        arrays, fp8 = fn(_current_stream(), *args)
    else:
        cp = cupy_module()
        with cp.cuda.Device(like.device):
            if stream is None:
                arrays, fp8 = fn(cp.cuda.get_current_stream(), *args)
            else:
                with stream:
                    arrays, fp8 = fn(stream, *args)
    if like.family != "cupy":
        if type(fp8) is tuple:  # the byte-code dtype of each output (None: none)
            arrays = tuple([outcome(like, r, k) for r, k in zip(arrays, fp8)])
        else:
            arrays = tuple([outcome(like, r, fp8 and i == 0) for i, r in enumerate(arrays)])
    return arrays[0] if len(arrays) == 1 else arrays


# CuPy's getDevice and get_current_stream, bound to these names at the first call (the
# attribute lookups through cupy.cuda cost a fifth of a microsecond a call).
def _get_device() -> int:
    global _get_device, _current_stream
    cp = cupy_module()
    _get_device, _current_stream = cp.cuda.runtime.getDevice, cp.cuda.get_current_stream
    return _get_device()


def _current_stream():
    _get_device()
    return _current_stream()


def props(device: int) -> dict:
    """Multiprocessor count and friends, read once per device."""
    p = _props.get(device)
    if p is None:
        cp = require_cupy("cuquant")
        attrs = cp.cuda.Device(device).attributes
        p = {"sm_count": attrs["MultiProcessorCount"],
             "smem_optin": attrs["MaxSharedMemoryPerBlockOptin"],
             "cc": cp.cuda.Device(device).compute_capability}
        _props[device] = p
    return p


def resident_blocks(fn, device: int, threads: int, smem: int = 0) -> int:
    """How many blocks of `fn` fit on the device at once (for persistent grids and
    grid-wide handshakes)."""
    ptr = fn.kernel.ptr
    key = (ptr, device, threads, smem)
    n = _occupancy.get(key)
    if n is None:
        cp = require_cupy("cuquant")
        per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(ptr, threads, smem)
        n = max(1, per_sm) * props(device)["sm_count"]
        _occupancy[key] = n
    return n


class Launch:
    """One compiled kernel, launched through the driver with a reusable per-thread argument
    block: CuPy's generic argument handling costs about half a microsecond an argument,
    which would be most of a small call's time. Arguments are given as integers (device
    pointers, sizes, and float32 values as their bits, see `f32_bits`), each in an 8-byte
    slot (the driver reads a 4-byte parameter from the low half, little-endian)."""

    __slots__ = ("fn", "ptr", "smem", "_pack", "_nargs", "_tls")

    def __init__(self, fn, nargs: int, smem: int = 0):
        self.fn = fn  # keeps the module loaded
        self.ptr = fn.kernel.ptr
        self.smem = smem
        self._nargs = nargs
        self._pack = struct.Struct(f"<{nargs}Q").pack_into
        self._tls = threading.local()
        _load_driver()
        # Above the default share (48 KB less the static part) a kernel must opt in; the
        # setting belongs to the kernel, so it is only ever raised (other plans use it too).
        if smem > fn.max_dynamic_shared_size_bytes:
            fn.max_dynamic_shared_size_bytes = smem

    def _block(self):
        vals = (ctypes.c_uint64 * self._nargs)()
        base = ctypes.addressof(vals)
        ptrs = (ctypes.c_void_p * self._nargs)(*(base + 8 * i for i in range(self._nargs)))
        b = self._tls.b = (vals, ptrs, ctypes.addressof(ptrs))
        return b

    def __call__(self, grid: int, threads: int, stream, args) -> None:
        try:
            vals, _, addr = self._tls.b
        except AttributeError:
            vals, _, addr = self._block()
        self._pack(vals, 0, *args)
        _driver.launchKernel(self.ptr, grid, 1, 1, threads, 1, 1, self.smem, stream.ptr, addr, 0)


class Outputs:
    """The output arrays of one kind of call, C-contiguous, carved out of one allocation,
    each 256-byte aligned; their offsets are worked out once. An allocation costs the host
    about as much as half a kernel launch, a sixth of a small call's budget, so a call
    makes one. The memory is released when every array is. `make()` returns the arrays as
    a tuple."""

    __slots__ = ("parts", "total", "make")

    def __init__(self, *specs):
        parts, total = [], 0
        for shape, dtype in specs:
            parts.append((tuple(shape), np.dtype(dtype), total))
            total += -(-math.prod(shape) * np.dtype(dtype).itemsize // 256) * 256
        self.parts, self.total = tuple(parts), total
        self.make = _maker(self.parts, total)


def _maker(parts, total):
    """A function making the arrays: written out for one and two arrays, the common cases,
    since a loop adds to the host time of every small call. The arrays are made from scalar
    types, which CuPy takes without first normalising a dtype object."""
    cp = cupy_module()
    alloc, nd = cp.cuda.alloc, cp.ndarray
    parts = tuple((shape, dtype.type, off) for shape, dtype, off in parts)
    if len(parts) == 1:
        (s0, d0, _), = parts
        return lambda: (nd(s0, d0, alloc(total)),)
    if len(parts) == 2:
        (s0, d0, _), (s1, d1, o1) = parts

        def make2():
            mem = alloc(total)
            return nd(s0, d0, mem), nd(s1, d1, mem + o1)
        return make2

    def make():
        mem = alloc(total)
        return tuple([nd(shape, dtype, mem + off if off else mem) for shape, dtype, off in parts])
    return make


PLAN_LIMIT = 4096  # launch plans a table keeps; past that it starts over (shapes vary in serving)

_tables: list = []  # every plan table made by plan_table()


def plan_table() -> dict:
    """A new table of launch plans (filled through `remember`), one that `clear_plans`
    empties."""
    table: dict = {}
    _tables.append(table)
    return table


def clear_plans() -> None:
    """Forget every launch plan and every replay of a repeated call, so that the next calls
    plan afresh and ask the loader for their kernels: the hook for tests that watch which
    kernels a call takes (see `kernels.recording`)."""
    for table in _tables:
        table.clear()
    _replay.clear()


def remember(table: dict, key, plan):
    """Store a launch plan under its problem's key and return it, keeping the table
    bounded: a server that meets ever new shapes must not grow it without end."""
    if len(table) >= PLAN_LIMIT:
        table.clear()
    table[key] = plan
    return plan


def f32_bits(v) -> int:
    """A float32 kernel argument as the integer a Launch takes."""
    return struct.unpack("<I", struct.pack("<f", v))[0]


_driver = None


def _load_driver():
    global _driver
    if _driver is None:
        _driver = require_cupy("cuquant").cuda.driver
    return _driver


def workspace(device: int, stream) -> object:
    """A zeroed 4-word uint32 workspace for this device and stream. Kernels that use it
    leave it zeroed, so it is allocated and cleared once, not per call; one per stream
    keeps concurrent streams apart."""
    key = (device, stream.ptr)
    ws = _workspaces.get(key)
    if ws is None:
        with _lock:
            ws = _workspaces.get(key)
            if ws is None:
                cp = require_cupy("cuquant")
                ws = cp.zeros(4, dtype=np.uint32)
                _workspaces[key] = ws
    return ws


def fastdiv(d: int) -> tuple[int, int]:
    """Magic and shift for dividing n < 2**31 by d on the device: (umulhi(n, m) + n) >> s."""
    if d >= 1 << 31:
        return 0, 31
    shift = (d - 1).bit_length()
    magic = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return magic, shift


def blocks_for(work_items: int, per_block: int, cap: int = 1 << 20) -> int:
    """A grid sized to the work (grid-stride loops cover the rest beyond cap)."""
    return max(1, min(cap, -(-work_items // per_block)))


__all__ = ["HOST", "NULL", "run", "props", "resident_blocks", "workspace",
           "fastdiv", "blocks_for", "Launch", "f32_bits", "Outputs", "remember", "plan_table",
           "clear_plans"]
