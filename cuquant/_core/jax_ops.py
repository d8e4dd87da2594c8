"""Calls on JAX arrays being traced (inside `jax.jit`, or any transformation that traces):
each becomes a `jax.experimental.buffer_callback`, whose outputs XLA allocates with the
shapes and dtypes the op declares (`_core.declare`). When the compiled computation runs,
the callback runs the public function on the call's buffers: on a GPU as CuPy views of
them, on XLA's stream for the call, the kernel writing into XLA's output buffers (copied
there, on that stream, only where a launcher made its outputs otherwise); on the CPU as
NumPy views, through the NumPy backend. Either way the bits are those of an eager call.

buffer_callback rather than an FFI handler of our own: it hands the callback XLA's stream
and the device buffers, the launch stays the public function's own, and nothing is built
or loaded besides. Imported only once a traced call arrives."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from . import declare as _declare

_Tracer = jax.core.Tracer
try:  # an eager array's type (jaxlib's ArrayImpl): the replay path takes these
    from jax._src.array import ArrayImpl as ARRAY_TYPE
except ImportError:
    ARRAY_TYPE = None
# (stream ptr, device, output buffers) -> a CuPy stream handing those buffers out as the
# call's outputs (`_cuda.launch.given_stream`; set by `_core.replay` on import).
GIVEN_STREAM = None


def traced(args, kwargs) -> bool:
    """Whether any array among the arguments (nested in tuples, lists, dicts) is traced."""
    return any(isinstance(a, _Tracer) for a in _leaves((args, kwargs)))


def _leaves(v):
    if isinstance(v, jax.Array):
        yield v
    elif isinstance(v, (tuple, list)):
        for e in v:
            yield from _leaves(e)
    elif isinstance(v, dict):
        for e in v.values():
            yield from _leaves(e)


class _Place:
    """Where an array argument goes in the callback's list of buffers."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


def _split(v, arrays):
    if isinstance(v, jax.Array):
        arrays.append(v)
        return _Place(len(arrays) - 1)
    if isinstance(v, tuple):
        return tuple(_split(e, arrays) for e in v)
    if isinstance(v, list):
        return [_split(e, arrays) for e in v]
    if isinstance(v, dict):
        return {k: _split(e, arrays) for k, e in v.items()}
    return v


def _join(v, arrays):
    if type(v) is _Place:
        return arrays[v.i]
    if isinstance(v, tuple):
        return tuple(_join(e, arrays) for e in v)
    if isinstance(v, list):
        return [_join(e, arrays) for e in v]
    if isinstance(v, dict):
        return {k: _join(e, arrays) for k, e in v.items()}
    return v


def route(call, args, kwargs):
    """The traced call `call(*args, **kwargs)` as a buffer callback: its outputs as the
    public function returns them (a list for an op of many outputs)."""
    if kwargs.get("stream") is not None:
        raise TypeError(f"{call.__name__}: stream= is not taken inside jax.jit; the call runs "
                        "on XLA's stream")
    kwargs = {k: v for k, v in kwargs.items() if k != "stream"}
    outs = _declare.outputs_of(call, args, kwargs)
    arrays: list = []
    a_spec, k_spec = _split(tuple(args), arrays), _split(kwargs, arrays)
    # Byte-wide floats (fp8, e8m0, fp4) cross as their uint8 bits: jaxlib's buffers give no
    # __cuda_array_interface__ for them, and a same-width bitcast costs XLA nothing.
    given = [a.dtype for a in arrays]
    arrays = [_as_bits(a) for a in arrays]
    shapes = []
    for o in outs:
        dt = _bits_dtype(jax.numpy.dtype(o.dtype))
        if o.column:  # a [g, round_up(m, 4)] buffer, seen transposed (see declare.Out)
            m, g = o.shape
            shapes.append(jax.ShapeDtypeStruct((g, -(-m // 4) * 4), dt))
        else:
            shapes.append(jax.ShapeDtypeStruct(o.shape, dt))
    results = buffer_callback(_Callback(call, a_spec, k_spec, outs, given), shapes)(*arrays)
    results = [_from_bits(r, jax.numpy.dtype(o.dtype)) for r, o in zip(results, outs)]
    results = [r[:, :o.shape[0]].T if o.column else r for r, o in zip(results, outs)]
    if call.__cuquant_many__:
        return list(results)
    return results[0] if len(results) == 1 else tuple(results)


def _narrow_float(dt) -> bool:
    """A byte-wide float dtype (ml_dtypes' fp8, e8m0 and fp4 types)."""
    return dt.itemsize == 1 and dt.kind == "V"


def _bits_dtype(dt):
    return np.dtype(np.uint8) if _narrow_float(dt) else dt


def _as_bits(a):
    if _narrow_float(np.dtype(a.dtype)):
        return jax.lax.bitcast_convert_type(a, np.uint8)
    return a


def _from_bits(r, dt):
    return jax.lax.bitcast_convert_type(r, dt) if _narrow_float(dt) else r


class _Callback:
    """The function XLA calls: runs the public function on the buffers (`given`: the
    dtypes the caller's arrays had, before byte-wide floats crossed as uint8)."""

    __slots__ = ("call", "a_spec", "k_spec", "outs", "given", "__weakref__")

    def __init__(self, call, a_spec, k_spec, outs, given):
        self.call, self.a_spec, self.k_spec, self.outs = call, a_spec, k_spec, outs
        self.given = given

    def __call__(self, ctx, out_buffers, *buffers):
        try:
            handle = ctx.stream  # XLA's stream on a GPU; the CPU has none
        except Exception:  # noqa: BLE001 - jaxlib's error for a computation on the CPU
            _cpu_callback(self, out_buffers, buffers)
            return
        _gpu_callback(self, handle, out_buffers, buffers)


def _results(call, res):
    return list(res) if isinstance(res, (tuple, list)) else [res]


def _cpu_callback(cb, out_buffers, buffers):
    arrays = [np.asarray(b).view(dt) for b, dt in zip(buffers, cb.given)]
    res = _results(cb.call, cb.call(*_join(cb.a_spec, arrays), **_join(cb.k_spec, arrays)))
    for r, o, b in zip(res, cb.outs, out_buffers):
        dst = np.asarray(b)
        if o.column:
            dst = dst[:, :o.shape[0]].T
        np.copyto(dst, np.asarray(r).view(dst.dtype) if r.dtype != dst.dtype else r)


def _gpu_callback(cb, handle, out_buffers, buffers):
    import cupy as cp

    ptrs = [b.__cuda_array_interface__["data"][0] for b in buffers]
    outs = [(b.__cuda_array_interface__["data"][0], tuple(b.shape), np.dtype(b.dtype))
            for b in out_buffers]
    device = _device_of([p for p in ptrs + [o[0] for o in outs] if p])
    with cp.cuda.Device(device):
        stream = GIVEN_STREAM(handle, device, outs)
        arrays = [_view(cp, p, tuple(b.shape), np.dtype(b.dtype), device)
                  for p, b in zip(ptrs, buffers)]
        with stream:
            res = _results(cb.call, cb.call(*_join(cb.a_spec, arrays), stream=stream,
                                            **_join(cb.k_spec, arrays)))
            for r, o, (p, shape, dt) in zip(res, cb.outs, outs):
                dst = _view(cp, p, shape, dt, device)
                if o.column:
                    dst = dst[:, :o.shape[0]].T
                if r.data.ptr != p or r.strides != dst.strides:  # not made in place
                    cp.copyto(dst, r.view(dt) if r.dtype != dt else r)


def _view(cp, ptr, shape, dtype, device):
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n == 0:
        return cp.empty(shape, dtype)
    mem = cp.cuda.UnownedMemory(ptr, n, None, device)
    return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))


def _device_of(ptrs) -> int:
    import cupy as cp

    if not ptrs:
        return cp.cuda.runtime.getDevice()
    return cp.cuda.runtime.pointerGetAttributes(ptrs[0]).device


__all__ = ["traced", "route"]
