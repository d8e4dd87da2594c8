"""Arrays in and out (docs/formats.md section 2).

`intake` turns whatever the caller passed into a backend array, NumPy on the host or CuPy
on a CUDA device, and remembers the caller's family. `outcome` hands results back in that
family, on that device. float8 crosses DLPack as uint8 codes and bfloat16 as 16-bit
integers, viewed back on the far side, since not every framework exchanges those dtypes.
"""

from __future__ import annotations

import sys
import warnings

import ml_dtypes
import numpy as np

from . import replay as _fast
from .dtypes import BYTE_CODES

HOST = -1

_FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_U8 = np.dtype(np.uint8)
# Byte-code dtypes by the NumPy dtype, their name in torch and JAX (the dtype table's).
_BYTE_NAMES = {np.dtype(d): name for name, d in BYTE_CODES.items()}
# torch's one-byte float dtypes taken in as bytes, and the NumPy dtype of their host view:
# float4_e2m1fn_x2 holds two e2m1 codes a byte, as cuquant's uint8 packing does.
_TORCH_BYTES = {**{name: np.dtype(d) for name, d in BYTE_CODES.items()},
                "float4_e2m1fn_x2": _U8}
_torch_bytes: dict = {}  # the same by torch dtype, made at the first torch tensor


def _torch_byte_dtypes(torch) -> dict:
    for name, d in _TORCH_BYTES.items():
        if hasattr(torch, name):
            _torch_bytes[getattr(torch, name)] = d
    return _torch_bytes


class In:
    """An argument taken in: the backend array, the caller's family, the device
    (HOST or a CUDA ordinal) and the caller's own object."""

    __slots__ = ("data", "family", "device", "source")

    def __init__(self, data, family: str, device: int, source):
        self.data = data
        self.family = family
        self.device = device
        self.source = source


_cupy = None


def cupy_module():
    """CuPy, imported on first need; None when it cannot be imported."""
    global _cupy
    if _cupy is None:
        try:
            import cupy

            _cupy = cupy
            _fast.enable(cupy)
        except Exception:  # noqa: BLE001 - any failure means no GPU path
            _cupy = False
    return _cupy or None


def require_cupy(op: str):
    cp = cupy_module()
    if cp is None:
        raise RuntimeError(
            f"{op}: this array lives on a CUDA device, which needs CuPy: install cuquant with "
            "the extra matching your CUDA toolkit, `pip install cuquant[cuda12]` or "
            "`pip install cuquant[cuda13]`"
        )
    return cp

def stream_arg(stream, op: str):
    """The stream= argument as a CuPy stream (None: the current CuPy stream at launch).
    Accepts a CuPy stream, an object speaking the CUDA stream protocol (`__cuda_stream__`)
    or holding a handle (`cuda_stream`, as torch.cuda.Stream does), or a raw cudaStream_t
    as an int."""
    if stream is None:
        return None
    cp = require_cupy(op)
    if isinstance(stream, cp.cuda.Stream) or isinstance(stream, cp.cuda.ExternalStream):
        return stream
    if hasattr(stream, "__cuda_stream__") and hasattr(cp.cuda.Stream, "from_external"):
        return cp.cuda.Stream.from_external(stream)
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not isinstance(handle, (int, np.integer)):
        raise TypeError(
            f"{op}: stream must be a CuPy stream, a torch.cuda.Stream or a cudaStream_t "
            f"handle (int); got {type(stream).__name__}"
        )
    with warnings.catch_warnings():  # the one way CuPy takes a bare handle
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(int(handle))


def contiguous(x):
    """x in C order (copied only when it is not)."""
    if isinstance(x, np.ndarray):
        return x if x.flags.c_contiguous else np.ascontiguousarray(x)
    # CuPy's own flag: x.flags builds an object a call (a third of a microsecond).
    return x if x._c_contiguous else cupy_module().ascontiguousarray(x)


def intake(x, op: str, arg: str, stream=None) -> In:
    """Take in one array argument. Raises TypeError for anything that is not an array."""
    t = type(x)
    if t is np.ndarray:
        return In(x, "numpy", HOST, x)
    cp = _cupy if _cupy else cupy_module()
    if cp is not None and t is cp.ndarray:
        return In(x, "cupy", x.data.device_id, x)
    module = t.__module__ or ""
    if module.startswith("torch"):
        return _from_torch(x, op, arg, stream)
    if module.startswith(("jax", "jaxlib")):
        return _from_jax(x, op, arg, stream)
    if hasattr(x, "__cuda_array_interface__"):
        cp = require_cupy(op)
        data = cp.asarray(x)
        return In(data, "cupy", data.data.device_id, x)
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        kind, _ = x.__dlpack_device__()
        if kind in (2, 3, 13):  # CUDA, CUDA host, CUDA managed
            cp = require_cupy(op)
            data = _cupy_from_dlpack(cp, x, stream)
            return In(data, "cupy", data.data.device_id, x)
        return In(np.from_dlpack(x), "numpy", HOST, x)
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return In(np.asarray(x), "numpy", HOST, x)
    raise TypeError(
        f"{op}: {arg} must be an array (NumPy, CuPy, PyTorch, JAX, or any object speaking "
        f"DLPack or the array protocol); got {t.__name__}"
    )


def _cupy_from_dlpack(cp, obj, stream):
    if stream is None:
        return cp.from_dlpack(obj)
    with stream:  # the producer orders its work before this stream
        return cp.from_dlpack(obj)


def _from_torch(x, op, arg, stream):
    torch = sys.modules["torch"]
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be an array; got {type(x).__name__}")
    _fast.enable_torch(torch)
    x = x.detach()
    dt = x.dtype
    if x.is_cuda:
        # The tensor's memory seen by CuPy, without DLPack: the call runs on torch's stream,
        # after whatever torch queued there. A strided tensor is copied by torch (on that
        # stream, from its allocator) to C order.
        cp = require_cupy(op)
        if not x.is_contiguous():
            x = x.contiguous()
        dtype = _torch_to_numpy(torch, dt, op, arg)
        mem = cp.cuda.UnownedMemory(x.data_ptr(), x.numel() * x.element_size(), x,
                                    x.device.index)
        data = cp.ndarray(tuple(x.shape), dtype, cp.cuda.MemoryPointer(mem, 0))
        return In(data, "torch", x.device.index, x)
    if x.device.type != "cpu":
        raise ValueError(f"{op}: {arg} is on device {x.device}; cuquant runs on CPU and CUDA")
    view_as = None
    y = x
    if dt == torch.bfloat16:
        y, view_as = x.view(torch.int16), _BF16
    elif dt in (_torch_bytes or _torch_byte_dtypes(torch)):
        # float8 codes, E8M0 scales, packed float4 pairs: their bytes, seen as uint8
        y, view_as = x.view(torch.uint8), _torch_bytes[dt]
    data = y.numpy()
    if view_as is not None:
        data = data.view(view_as)
    return In(data, "torch", HOST, x)


_TORCH_DTYPES: dict = {}


def _torch_to_numpy(torch, dt, op, arg):
    """The NumPy dtype a CUDA tensor's memory is read as (byte codes as uint8, as CuPy holds
    them)."""
    if not _TORCH_DTYPES:
        for name in ("float16", "float32", "float64", "int8", "uint8", "int16", "int32",
                     "int64", "uint16", "uint32", "uint64", "bool"):
            if hasattr(torch, name):
                _TORCH_DTYPES[getattr(torch, name)] = np.dtype(name)
        _TORCH_DTYPES[torch.bfloat16] = _BF16
        # byte codes (float8, E8M0, packed float4 pairs) as uint8, as CuPy holds them
        for d in (_torch_bytes or _torch_byte_dtypes(torch)):
            _TORCH_DTYPES[d] = _U8
    d = _TORCH_DTYPES.get(dt)
    if d is None:
        raise TypeError(f"{op}: {arg} has dtype {dt}, which cuquant does not take")
    return d


def _from_jax(x, op, arg, stream):
    """A JAX array: on the host, its NumPy view; on a CUDA device, its memory seen by CuPy
    through its address (no DLPack round trip). An array still being computed makes the
    launch stream wait for it on the device (DLPack's handshake: the host does not wait);
    a ready one costs nothing more."""
    jax = sys.modules["jax"]
    if not isinstance(x, jax.Array):
        raise TypeError(f"{op}: {arg} must be an array; got {type(x).__name__}")
    if isinstance(x, jax.core.Tracer):
        raise TypeError(f"{op}: {arg} is traced (jax.jit) but the first array argument is "
                        "not; pass the call's arrays all as JAX arrays")
    devices = x.sharding.device_set
    if len(devices) != 1:
        raise ValueError(f"{op}: {arg} is sharded over {len(devices)} devices; pass one shard")
    dev = next(iter(devices))
    platform = dev.platform
    if platform == "cpu":
        return In(np.asarray(x), "jax", HOST, x)
    if platform not in ("gpu", "cuda"):
        raise ValueError(f"{op}: {arg} is on a {platform} device; cuquant runs on CPU and CUDA")
    cp = require_cupy(op)
    device = dev.local_hardware_id
    if device not in _JAX_DEVICES:
        _JAX_DEVICES[device] = (dev, dev.get_stream_for_external_ready_events())
    dt = x.dtype
    if dt in _BYTE_NAMES:
        dt = _U8  # byte codes, as CuPy holds them
    n = x.size * dt.itemsize
    if n == 0:
        return In(cp.empty(x.shape, dt), "jax", device, x)
    if not x.is_ready():
        s = stream.ptr if stream is not None else _JAX_DEVICES[device][1]
        x.__dlpack__(stream=s or 1)  # the stream waits for x (1: the legacy default stream)
    mem = cp.cuda.UnownedMemory(x.unsafe_buffer_pointer(), n, x, device)
    return In(cp.ndarray(x.shape, dt, cp.cuda.MemoryPointer(mem, 0)), "jax", device, x)


_JAX_DEVICES: dict = {}  # CUDA ordinal -> (JAX device, its stream for external ready events)


def jax_stream_ptr(device: int) -> int:
    """The stream JAX takes external work from on CUDA device `device` (a JAX array on it
    has been taken in)."""
    return _JAX_DEVICES[device][1]


# ---------------------------------------------------------------------------------------
# Out

def outcome(like: In, data, fp8=False):
    """Hand one backend array back in the family of `like`, on its device. `fp8` marks a
    CuPy uint8 array that holds float8_e4m3fn codes (True), or names the byte-code dtype it
    holds (a NumPy dtype of the dtype table's BYTE_CODES)."""
    family = like.family
    if family == "numpy" or family == "cupy":
        return data
    if family == "torch":
        return as_torch(data, fp8)
    return to_jax(like, data, fp8)


def _byte_name(fp8) -> str | None:
    """The torch / JAX name of the byte codes that `fp8` (see outcome) marks, or None."""
    if fp8 is True:
        return "float8_e4m3fn"
    return _BYTE_NAMES.get(fp8) if fp8 else None


def torch_bytes_view(t, fp8):
    """A uint8 tensor made for byte codes (`fp8` as in `outcome`) viewed as their torch
    dtype (E8M0 scales: torch.float8_e8m0fnu); any other tensor as it is."""
    name = _byte_name(fp8)
    torch = sys.modules["torch"]
    if name and t.dtype == torch.uint8:
        return t.view(getattr(torch, name))
    return t


def as_torch(data, fp8=False):
    """A NumPy or CuPy array as a torch tensor on its device, without a copy: bfloat16 and
    byte codes (float8_e4m3fn, float8_e8m0fnu) through integer views; `fp8` marks a CuPy
    uint8 array of byte codes (see outcome). torch must be imported already."""
    torch = sys.modules["torch"]
    dt = data.dtype
    if isinstance(data, np.ndarray):
        if dt == _BF16:
            return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
        name = _BYTE_NAMES.get(dt)
        if name is not None:
            return torch.from_numpy(data.view(np.uint8)).view(getattr(torch, name))
        return torch.from_numpy(data)
    if dt == _BF16:
        return torch.from_dlpack(data.view(np.int16)).view(torch.bfloat16)
    out = torch.from_dlpack(data)
    name = _byte_name(fp8)
    return out.view(getattr(torch, name)) if name else out


def to_jax(like, data, fp8=False, keep=None):
    """A result as a JAX array. On a GPU, handed to JAX without a copy through DLPack,
    ordered on the stream JAX takes external work from (the current stream is the launch
    stream); bfloat16, float8_e4m3fn and (where jaxlib takes its code) float8_e8m0fnu go as
    16- and 8-bit integers whose DLPack type code is rewritten, so that no JAX op is
    dispatched to view them back. `keep` (the call's inputs) lives as long as the result:
    JAX does not know the launch read them, and would otherwise give their memory to new
    arrays as soon as the caller drops them."""
    jax = sys.modules["jax"]
    if like.device == HOST:
        return jax.device_put(data, next(iter(like.source.devices())))
    global _e8m0_code
    cp = _cupy
    if not data._c_contiguous:
        data = cp.ascontiguousarray(data)
    dev, ext = _JAX_DEVICES[like.device]
    dt = data.dtype
    code = None
    name = _byte_name(fp8) or _BYTE_NAMES.get(dt)
    if name == "float8_e4m3fn":
        data, code = data.view(np.uint8), _DL_FLOAT8_E4M3FN
    elif dt == _BF16:
        data, code = data.view(np.uint16), _DL_BFLOAT
    elif name is not None:
        # other byte codes (E8M0 scales): DLPack's code where jaxlib takes it, else taken in
        # as uint8 and viewed by a JAX op
        if name != "float8_e8m0fnu" or _e8m0_code is False:
            out = to_jax(like, data.view(np.uint8), False, keep)
            return jax.lax.bitcast_convert_type(out, BYTE_CODES[name])
        data, code = data.view(np.uint8), _DL_FLOAT8_E8M0FNU
    if keep is not None and data.size:
        mem = cp.cuda.UnownedMemory(data.data.ptr, data.nbytes, (data, keep), like.device)
        data = cp.ndarray(data.shape, data.dtype, cp.cuda.MemoryPointer(mem, 0))
    capsule = data.__dlpack__(stream=ext or 1)  # 1: the legacy default stream
    if code is not None:
        _set_dlpack_code(capsule, code)
    if code != _DL_FLOAT8_E8M0FNU or _e8m0_code:
        return _jax_from_capsule(jax, capsule, dev, ext)
    try:  # the first E8M0 result: whether this jaxlib takes the code
        out = _jax_from_capsule(jax, capsule, dev, ext)
    except Exception:  # noqa: BLE001 - refused: the capsule is left unconsumed
        _e8m0_code = False
        return to_jax(like, data, np.dtype(BYTE_CODES[name]), keep)
    _e8m0_code = out.dtype == BYTE_CODES[name]
    return out if _e8m0_code else jax.lax.bitcast_convert_type(out, BYTE_CODES[name])


# DLPack's type codes (dlpack.h, DLDataTypeCode) of the types JAX takes in their place.
_DL_BFLOAT, _DL_FLOAT8_E4M3FN, _DL_FLOAT8_E8M0FNU = 4, 10, 14
_e8m0_code = None  # whether jaxlib takes DLPack's E8M0 code (None: not yet known)
_capsule_pointer = None


def _set_dlpack_code(capsule, code: int) -> None:
    """Rewrite the type code of an unconsumed DLPack capsule ("dltensor": a DLManagedTensor,
    whose DLTensor has the data pointer, the device (two int32), ndim (int32) and then the
    type's code, bits and lanes)."""
    global _capsule_pointer
    import ctypes

    if _capsule_pointer is None:
        f = ctypes.pythonapi.PyCapsule_GetPointer
        f.restype, f.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        _capsule_pointer = f
    ctypes.c_uint8.from_address(_capsule_pointer(capsule, b"dltensor") + 20).value = code


_jax_import = None


def _jax_from_capsule(jax, capsule, dev, ext, kind: int = 2):
    """jaxlib's own import of a DLPack capsule onto `dev` (DLPack device type `kind`: 2 is
    CUDA), its readiness taken from stream `ext` (what jax.dlpack.from_dlpack does after
    its checks); the public function where jaxlib's differs."""
    global _jax_import
    if _jax_import is None:
        try:
            from jax._src.lib import _jax as _jaxlib, jaxlib_extension_version

            f = _jaxlib.dlpack_managed_tensor_to_buffer
            if jaxlib_extension_version >= 467:
                _jax_import = lambda c, d, s, k: f(c, d, s, None, k)  # noqa: E731
            else:
                _jax_import = lambda c, d, s, k: f(c, d, s, None)  # noqa: E731
        except (ImportError, AttributeError):
            _jax_import = lambda c, d, s, k: jax.dlpack.from_dlpack(  # noqa: E731
                _Capsule(c, d, k))
    return _jax_import(capsule, dev, ext, kind)


class _Capsule:
    """A DLPack capsule made already, for jax.dlpack.from_dlpack."""

    def __init__(self, capsule, dev, kind):
        self.capsule, self.dev, self.kind = capsule, dev, kind

    def __dlpack__(self, stream=None, **_):
        return self.capsule

    def __dlpack_device__(self):
        return (self.kind, self.dev.local_hardware_id)


# ---------------------------------------------------------------------------------------
# Several arguments of one call

def same_place(op: str, first: tuple[str, In], *others: tuple[str, In]) -> None:
    """Every array of a call must live where the first does."""
    name0, a0 = first
    for name, a in others:
        if a.device != a0.device:
            raise ValueError(
                f"{op}: {name} is on {_where(a.device)} but {name0} is on {_where(a0.device)}; "
                "pass every array on one device"
            )


def _where(device: int) -> str:
    return "the host" if device == HOST else f"cuda:{device}"


__all__ = ["HOST", "In", "intake", "outcome", "same_place", "cupy_module", "require_cupy"]
