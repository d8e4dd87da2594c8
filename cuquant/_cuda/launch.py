"""What every GPU launch needs: the stream, the device's properties, per-stream workspaces,
and run-time divisors. Imported lazily by the ops, only when a CUDA array arrives."""

from __future__ import annotations

import ctypes
import math
import struct
import threading

import numpy as np

from .._core import replay as _replay
from .._core.arrays import (HOST, In, cupy_module, jax_stream_ptr, outcome, require_cupy, to_jax,
                            torch_bytes_view)
from .._core.dtypes import BYTE_CODES

_props: dict = {}
_workspaces: dict = {}
_occupancy: dict = {}
_lock = threading.Lock()

NULL = np.uint64(0)  # a null pointer argument



def run(like, stream, fn, *args):
    """Call fn(stream, *args) on the device of `like` and hand its results back in the
    caller's family. fn returns (arrays, fp8): a tuple of arrays, and whether the first
    holds fp8 codes, or a tuple naming each array's byte-code dtype (a NumPy dtype, or
    None). CuPy arrays run on CuPy's current stream (or `stream`); torch tensors on
    torch's current stream of their device (or `stream`), with their outputs made by torch
    (`TorchStream`)."""
    if like.family == "torch":
        return _run_torch(like, stream, fn, args)
    if like.family == "jax" and like.device != HOST:
        return _run_jax(like, stream, fn, args)
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
        arrays = tuple([outcome(like, r, _kind(fp8, i)) for i, r in enumerate(arrays)])
    return arrays[0] if len(arrays) == 1 else arrays


def _kind(fp8, i: int):
    """What `outcome` is told of output i: fp8 is whether the first output holds fp8 codes,
    or a tuple of each output's byte-code dtype."""
    return fp8[i] if type(fp8) is tuple else (fp8 and i == 0)


def _run_torch(like, stream, fn, args):
    """A torch call: launched on torch's current stream of the device (or `stream`), its
    outputs made by torch. CuPy's current stream is that stream meanwhile, so that anything
    else the launcher does with CuPy (copies of odd inputs, fills of empty outputs) is
    ordered with the launch."""
    cp = cupy_module()
    device = like.device
    ptr = torch_stream_ptr(device) if stream is None else stream.ptr
    ts = torch_stream(device, ptr)
    with cp.cuda.Device(device), ts.cupy():
        arrays, fp8 = fn(ts, *args)
    torch = _torch()
    arrays = tuple([torch_bytes_view(r, _kind(fp8, i)) if isinstance(r, torch.Tensor)
                    else outcome(like, r, _kind(fp8, i)) for i, r in enumerate(arrays)])
    return arrays[0] if len(arrays) == 1 else arrays


def _run_jax(like, stream, fn, args):
    """A JAX eager call: launched on the stream JAX takes external work from on the array's
    device (`jax_stream`, or `stream`), its outputs handed to JAX there, so that JAX's own
    work on them is ordered after the launch."""
    cp = cupy_module()
    if stream is None:
        stream = jax_stream(like.device)
    with cp.cuda.Device(like.device), stream:
        arrays, fp8 = fn(stream, *args)
        arrays = tuple([to_jax(like, r, _kind(fp8, i), args) for i, r in enumerate(arrays)])
    return arrays[0] if len(arrays) == 1 else arrays


_jax_streams: dict = {}  # CUDA ordinal -> CuPy stream


def jax_stream(device: int):
    """The stream JAX takes external work from on `device` (its stream for external ready
    events, as a CuPy stream; made once)."""
    s = _jax_streams.get(device)
    if s is None:
        import warnings

        cp = cupy_module()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cp.cuda.ExternalStream(jax_stream_ptr(device), device)
        _jax_streams[device] = s
    return s


_given_type = None


def given_stream(ptr: int, device: int, outs):
    """A CuPy stream for `ptr` that carries the buffers a caller has for a call's outputs
    (address, shape, dtype each): `Outputs.make` hands them out, once, when they are what
    it would make (XLA's output buffers in a jax.jit call, `_core.jax_ops`)."""
    global _given_type
    cp = cupy_module()
    if _given_type is None:
        class GivenStream(cp.cuda.ExternalStream):
            pass
        _given_type = GivenStream
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        s = _given_type(ptr, device)
    s.given, s.given_device = list(outs), device
    return s


def _torch():
    import sys

    return sys.modules["torch"]


class TorchStream:
    """A torch stream as the launchers see it: the raw handle (`ptr`, as a CuPy stream has
    one) and the device whose caching allocator makes the outputs (see `Outputs.make`)."""

    __slots__ = ("ptr", "device", "torch_device", "_cupy")

    def __init__(self, device: int, ptr: int):
        self.ptr, self.device = ptr, device
        self.torch_device = _torch().device("cuda", device)
        self._cupy = None

    def cupy(self):
        """The same stream as a CuPy stream (made once)."""
        if self._cupy is None:
            import warnings

            cp = cupy_module()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                self._cupy = cp.cuda.ExternalStream(self.ptr, self.device)
        return self._cupy


_torch_streams: dict = {}  # raw handle -> TorchStream
_raw_stream = None


def torch_stream(device: int, ptr: int) -> TorchStream:
    ts = _torch_streams.get(ptr)
    if ts is None or ts.device != device:
        if len(_torch_streams) >= PLAN_LIMIT:
            _torch_streams.clear()
        ts = _torch_streams[ptr] = TorchStream(device, ptr)
    return ts


def torch_stream_ptr(device: int) -> int:
    """The raw handle of torch's current stream on `device`: torch's own accessor (a fifth
    of a microsecond), or its public one where that is missing."""
    global _raw_stream
    if _raw_stream is None:
        torch = _torch()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw if raw is not None else (
            lambda d: torch.cuda.current_stream(d).cuda_stream)
    return _raw_stream(device)


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
        try:  # inline: this is every call's launch
            _driver.launchKernel(self.ptr, grid, 1, 1, threads, 1, 1, self.smem, stream.ptr,
                                 addr, 0)
        except _driver.CUDADriverError as e:
            self._launch_in_context(e, grid, threads, stream, addr)

    def with_struct(self, grid: int, threads: int, stream, data) -> None:
        """Launch a kernel whose one argument is a struct passed by value, `data` its bytes
        (a ctypes buffer): the driver copies it at the launch."""
        ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(data))  # kept alive past the launch
        params = ctypes.addressof(ptrs)
        try:
            _driver.launchKernel(self.ptr, grid, 1, 1, threads, 1, 1, self.smem, stream.ptr,
                                 params, 0)
        except _driver.CUDADriverError as e:
            self._launch_in_context(e, grid, threads, stream, params)

    def _launch_in_context(self, error, grid: int, threads: int, stream, params: int) -> None:
        """The launch again, after one refused for want of a current context (any other
        error is raised); `params` is the address of the argument pointers."""
        _make_context_current(error)
        _driver.launchKernel(self.ptr, grid, 1, 1, threads, 1, 1, self.smem, stream.ptr,
                             params, 0)


class Outputs:
    """The output arrays of one kind of call, C-contiguous, each 256-byte aligned; their
    layout is worked out once. `make(stream)` returns (arrays, addresses): for a CuPy stream,
    CuPy arrays carved out of one allocation from CuPy's pool (an allocation costs the host
    about as much as half a kernel launch, so a call makes one; the memory is released when
    every array is); for a `TorchStream`, tensors made by torch on its device (`_torch_maker`:
    the caching allocator, and its graph pool while a graph is captured). float8_e4m3fn outputs
    and E8M0 outputs are uint8 codes in CuPy and typed tensors in torch."""

    __slots__ = ("parts", "total", "torch_names", "_cupy", "_torch")

    def __init__(self, *specs):
        """specs: (shape, dtype) each, or (shape, dtype, torch dtype name) for an output whose
        torch tensor has a dtype of its own over the same bytes (packed float4 pairs)."""
        parts, total = [], 0
        for shape, dtype, *_ in specs:
            parts.append((tuple(shape), np.dtype(dtype), total))
            total += -(-math.prod(shape) * np.dtype(dtype).itemsize // 256) * 256
        self.parts, self.total = tuple(parts), total
        self.torch_names = tuple(spec[2] if len(spec) > 2 else None for spec in specs)
        self._cupy = _maker(tuple((s, _cupy_type(d), o) for s, d, o in self.parts), total)
        self._torch = None

    def make(self, stream):
        if type(stream) is TorchStream:
            maker = self._torch
            if maker is None:
                maker = self._torch = _torch_maker(self.parts, self.torch_names)
            return maker(stream.torch_device)
        if type(stream) is _given_type and stream.given:
            return self._take(stream)
        return self._cupy()

    def _take(self, stream):
        """The caller's buffers when they are these outputs (each once), else new ones."""
        given = stream.given
        if len(given) != len(self.parts) or any(
                shape != tuple(s) or dt != np.dtype(_cupy_type(d))
                for (_, shape, dt), (s, d, _) in zip(given, self.parts)):
            return self._cupy()
        stream.given = None
        cp = cupy_module()
        arrays = []
        for p, shape, dt in given:
            n = math.prod(shape) * dt.itemsize
            if n:
                mem = cp.cuda.MemoryPointer(
                    cp.cuda.UnownedMemory(p, n, None, stream.given_device), 0)
                arrays.append(cp.ndarray(shape, dt, mem))
            else:
                arrays.append(cp.empty(shape, dt))
        return tuple(arrays), tuple([p for p, _, _ in given])



def _cupy_type(dtype: np.dtype):
    """The scalar type CuPy makes an output of `dtype` with (byte codes, float8_e4m3fn and
    E8M0, as uint8)."""
    return np.uint8 if dtype.name in BYTE_CODES else dtype.type


def _maker(parts, total):
    """A function making the CuPy arrays and their addresses: written out for one and two
    arrays, the common cases, since a loop adds to the host time of every small call. The
    arrays are made from scalar types, which CuPy takes without first normalising a dtype
    object."""
    cp = cupy_module()
    alloc, nd = cp.cuda.alloc, cp.ndarray
    if len(parts) == 1:
        (s0, d0, _), = parts

        def make1():
            mem = alloc(total)
            return (nd(s0, d0, mem),), (mem.ptr,)
        return make1
    if len(parts) == 2:
        (s0, d0, _), (s1, d1, o1) = parts

        def make2():
            mem = alloc(total)
            p = mem.ptr
            return (nd(s0, d0, mem), nd(s1, d1, mem + o1)), (p, p + o1)
        return make2

    def make():
        mem = alloc(total)
        p = mem.ptr
        return (tuple([nd(shape, dtype, mem + off if off else mem) for shape, dtype, off in parts]),
                tuple([p + off for _, _, off in parts]))
    return make


def torch_dtype(dtype: np.dtype):
    """The torch dtype of a NumPy (or ml_dtypes) dtype."""
    torch = _torch()
    name = np.dtype(dtype).name
    return getattr(torch, name)


def _torch_maker(parts, names=None):
    """A function making the tensors of `parts` on a device, and their addresses (one and
    two outputs written out, as `_maker`). Each is `torch.empty_like` of a template of its
    shape and dtype over one element (stride 0, so not dense: the new tensor is made
    C-contiguous): torch's allocator and current stream, as `torch.empty`, without parsing
    a shape, dtype and device every call, which is most of `torch.empty`'s host time.
    Templates are made once a device. `names`: torch dtype names that replace some outputs'
    dtypes (None for none)."""
    torch = _torch()
    empty_like = torch.empty_like
    names = names or (None,) * len(parts)
    specs = tuple((shape, getattr(torch, n) if n else torch_dtype(dtype))
                  for (shape, dtype, _), n in zip(parts, names))
    templates: dict = {}

    def made(device):
        t = templates[device] = tuple(_template(torch, shape, dt, device) for shape, dt in specs)
        return t

    if len(specs) == 1:
        def make1(device):
            t0, = templates.get(device) or made(device)
            a = empty_like(t0)
            return (a,), (a.data_ptr(),)
        return make1
    if len(specs) == 2:
        def make2(device):
            t0, t1 = templates.get(device) or made(device)
            a, b = empty_like(t0), empty_like(t1)
            return (a, b), (a.data_ptr(), b.data_ptr())
        return make2

    def make(device):
        arrays = tuple([empty_like(t) for t in templates.get(device) or made(device)])
        return arrays, tuple([a.data_ptr() for a in arrays])
    return make


def _template(torch, shape, dtype, device):
    """A tensor of `shape` and `dtype` on `device` whose elements all share one (an expanded
    view), for `torch.empty_like`: not dense, so its copies are made C-contiguous."""
    if len(shape) < 1 or math.prod(shape) <= 1:
        return torch.empty(shape, dtype=dtype, device=device)  # already C-contiguous
    return torch.empty((1,) * len(shape), dtype=dtype, device=device).expand(shape)


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


_CUDA_ERROR_INVALID_CONTEXT = 201


def _make_context_current(error) -> None:
    """After a launch refused for want of a current context, make the current device's
    primary context current in this thread, as CuPy's own calls do. A thread that has made
    no runtime call yet has none (a Dask worker's thread whose first call is a replay: the
    replay makes no runtime call before its launch). Any other error is raised."""
    if getattr(error, "status", None) != _CUDA_ERROR_INVALID_CONTEXT:
        raise error
    cp = require_cupy("cuquant")
    cp.cuda.runtime.free(0)  # cudaFree(NULL) binds the primary context to the thread


def _load_driver():
    global _driver
    if _driver is None:
        _driver = require_cupy("cuquant").cuda.driver
    return _driver


def workspace(device: int, stream) -> int:
    """The address of a zeroed 4-word uint32 workspace for this device and stream. Kernels
    that use it leave it zeroed (the last block out clears it), so it is allocated and
    cleared once, on the stream itself (so that the clearing comes before the first launch
    on it), not per call; one per stream keeps concurrent streams apart. A torch stream's is
    made by torch: while a graph is captured, in the graph's pool, its clearing a node of
    the graph."""
    key = (device, stream.ptr)
    ws = _workspaces.get(key)
    if ws is None:
        with _lock:
            ws = _workspaces.get(key)
            if ws is None:
                if type(stream) is TorchStream:
                    torch = _torch()
                    with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr, device=device)):
                        buf = torch.zeros(4, dtype=torch.int32, device=stream.torch_device)
                    ws = (buf, buf.data_ptr())
                else:
                    cp = require_cupy("cuquant")
                    with stream:
                        buf = cp.zeros(4, dtype=np.uint32)
                    ws = (buf, buf.data.ptr)
                _workspaces[key] = ws
    return ws[1]


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


def _torch_place(device: int) -> TorchStream:
    """torch's current stream of `device`, for the replays of calls on torch tensors."""
    return torch_stream(device, torch_stream_ptr(device))


_replay.TORCH_PLACE = _torch_place
_replay.GIVEN_STREAM = given_stream


def _jax_place(device: int):
    """The stream JAX takes external work from on `device`, as a CuPy stream and a handle."""
    return jax_stream(device), jax_stream_ptr(device)


def _jax_result(device: int, data, fp8, keep):
    return to_jax(In(None, "jax", device, None), data, fp8, keep)


_replay.JAX_PLACE, _replay.JAX_RESULT = _jax_place, _jax_result


__all__ = ["HOST", "NULL", "run", "jax_stream", "given_stream", "TorchStream", "torch_stream", "torch_stream_ptr", "torch_dtype", "props", "resident_blocks", "workspace",
           "fastdiv", "blocks_for", "Launch", "f32_bits", "Outputs", "remember", "plan_table",
           "clear_plans"]
