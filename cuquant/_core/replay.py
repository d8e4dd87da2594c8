"""Repeated calls on CuPy arrays, taken straight to their launch.

A small call's host time is mostly fixed costs: the launch and the output arrays. The rest,
taking the arguments in, checking them and finding the launch plan, is the same work every
time the same kind of call comes back. So the first call on CuPy arrays with a given key
goes the whole way and leaves behind a replay: a function of the stream and the arrays'
addresses that allocates the outputs and launches, exactly as that call did. Later calls
with the key run the replay.

The key holds everything the checks and the plan depend on: the op, every other argument
with its type (so ``group_size=True`` never reaches the replay of ``group_size=1``), and
each array's shape, dtype, alignment (address mod 16) and device. Only C-contiguous CuPy
arrays on the current device and stream take this path (torch tensors and JAX arrays on
theirs), given by position or by name, and only plain values (numbers, strings, dtypes,
torch's and JAX's dtypes, tuples of them, and values of a type that declares
`__replay_plain__`: immutable and compared by value, as the kernel policy) beside them;
anything else goes the whole way every time. An op may name arguments whose value the
launch takes at run time (a seed): the key holds their type, not their value, and the
replay is handed the value, after the op's own test of it (anything it refuses goes the
whole way, which raises).
A replay is only ever left behind by a call that passed every check and made exactly one
launch with the arrays as given (no copies), so a key reaches only work that call did."""

from __future__ import annotations

import functools
import inspect
import threading

import numpy as np

from .dask import call as dask_call, is_dask
from .dtypes import BYTE_CODES

PLAN_LIMIT = 4096  # replays kept; past that the table starts over (as the launch plan tables)

_table: dict = {}  # key -> replay
_tls = threading.local()

# CuPy's ndarray, getDevice and get_current_stream, set by `enable` once CuPy is imported.
ND = None
_device = _stream = None
# torch.Tensor, set by `enable_torch` once a torch tensor arrives.
TT = None

# Types of the arguments besides arrays that a key may hold (and NumPy dtypes): values that
# compare equal only when they mean the same, once their type is in the key too. torch's
# and JAX's dtype types join when those frameworks are first met (immutable, compared by
# identity).
_PLAIN = {int, float, str, bool, type(None), type}


def _plain(v) -> bool:
    t = type(v)
    if t is tuple:
        return all(_plain(e) for e in v)
    return t in _PLAIN or isinstance(v, np.dtype) or getattr(t, "__replay_plain__", False)


def enable(cp) -> None:
    """Called once CuPy is imported: from then on its arrays can take this path."""
    global ND, _device, _stream
    _device, _stream = cp.cuda.runtime.getDevice, cp.cuda.get_current_stream
    ND = cp.ndarray


def enable_torch(torch) -> None:
    """Called when a torch tensor first arrives: from then on tensors can take this path."""
    global TT, _is_compiling
    compiler = getattr(torch, "compiler", None)
    _is_compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
    _PLAIN.add(type(torch.float32))  # torch.dtype
    TT = torch.Tensor


def _enable_torch() -> bool:
    import sys

    enable_torch(sys.modules["torch"])
    return True


# Marked for torch.compile as a call of constant result (torch._dynamo.assume_constant_result):
# when the first call of a process is being traced, the tracer runs it rather than tracing it.
_enable_torch._dynamo_marked_constant = True


def replayable(op=None, *, values=None):
    """Give the public op `op(x, ..., stream=None)` the replay path (x given by position).
    `values`: {argument name: test} for arguments passed by name whose value the launch
    takes at run time rather than the key (a seed): an int that passes `test` reaches the
    replay as a value (the launcher's replay takes it after the addresses)."""
    if op is None:
        return lambda f: replayable(f, values=values)
    # Array arguments given by name must come in the op's own order: the addresses are
    # handed to the replay in that order.
    order = {name: i for i, name in enumerate(inspect.signature(op).parameters)}
    spec = (order, values or {})

    @functools.wraps(op)
    def call(*args, stream=None, **kwargs):
        if stream is not None or not args:
            if args and is_dask(args[0]):
                return dask_call(call, op.__name__, args, dict(kwargs, stream=stream))
            if args and _compiling(args[0]):
                return _torch_route(call, args, dict(kwargs, stream=stream))
            if args and type(args[0]).__module__.startswith(_JAX) and _jax_traced(args, kwargs):
                return JAX_OPS.route(call, args, dict(kwargs, stream=stream))
            return op(*args, stream=stream, **kwargs)
        x = args[0]
        tx = type(x)
        if tx is not ND or not x._c_contiguous:
            if tx is TT or (TT is None and tx.__module__ == "torch"):
                return _torch_call(op, call, spec, x, args, kwargs)
            if tx.__module__.startswith(_JAX):
                if _jax_traced(args, kwargs):
                    return JAX_OPS.route(call, args, kwargs)  # inside jax.jit
                return _jax_call(op, spec, x, args, kwargs)
            if is_dask(x):  # chunk by chunk, each through this op
                return dask_call(call, op.__name__, args, kwargs)
            return op(*args, **kwargs)
        args = args[1:]
        d = x.data
        device = d.device_id
        ptrs = [d.ptr]
        key = (op, x.shape, x.dtype, ptrs[0] & 15, device)
        if args or kwargs:
            vals = []
            key = _key_rest(key, ptrs, device, args, kwargs, spec, vals)
            if key is None:
                return op(x, *args, **kwargs)
            replay = _table.get(key)
            if replay is not None and _device() == device:
                return replay(_stream(), ptrs, *vals)
            return _first(op, key, (x,) + args, kwargs)
        replay = _table.get(key)
        if replay is not None and _device() == device:
            return replay(_stream(), ptrs)
        return _first(op, key, (x,) + args, kwargs)

    return call


def _torch_call(op, call, spec, x, args, kwargs):
    """A call whose first array is a torch tensor: under torch.compile, the op's torch
    custom op; a C-contiguous CUDA tensor on the current device, its replay when one is
    kept (launched on torch's current stream, outputs from torch's allocator); else the whole
    way."""
    if _compiling(x):
        return _torch_route(call, args, kwargs)
    device = x.get_device()
    if device < 0 or not x.is_contiguous():
        return op(*args, **kwargs)
    p = x.data_ptr()
    ptrs, vals = [p], []
    key = (op, x.shape, x.dtype, p & 15, device)
    if len(args) > 1 or kwargs:
        key = _key_rest(key, ptrs, device, args[1:], kwargs, spec, vals)
        if key is None:
            return op(*args, **kwargs)
    replay = _table.get(key)
    if replay is not None and _device() == device:
        return replay(TORCH_PLACE(device), ptrs, *vals)
    return _first(op, key, args, kwargs)


TORCH_PLACE = None  # device -> the TorchStream of torch's current stream (set by _cuda.launch)
# (stream ptr, device, output buffers) -> a CuPy stream handing out those buffers as a call's
# outputs (set by _cuda.launch; for _core.jax_ops).
GIVEN_STREAM = None


def _compiling(x) -> bool:
    """Whether torch.compile is tracing a call with the torch tensor x (False for any other
    argument, and in eager calls)."""
    if TT is None:  # torch's first tensor, maybe under the tracer (which reads TT as None)
        if type(x).__module__ != "torch":
            return False
        _enable_torch()
        import torch

        return torch.compiler.is_compiling()
    return type(x) is TT and _is_compiling()


_is_compiling = None  # torch.compiler.is_compiling, set by enable_torch


def _torch_route(call, args, kwargs):
    """Under torch.compile: the call as its torch custom op (`_core.torch_ops`)."""
    _register_torch_ops()
    return ROUTE(call, args, kwargs)


ROUTE = None  # set by _core.torch_ops once the custom ops are registered


def _register_torch_ops() -> bool:
    """Register every op as a torch custom op (once). Marked for torch.compile as a call
    of constant result, so that the tracer runs it rather than tracing into the import."""
    global ROUTE
    if ROUTE is None:
        from . import torch_ops

        ROUTE = torch_ops.register()
    return True


_register_torch_ops._dynamo_marked_constant = True  # torch._dynamo.assume_constant_result


NOT_TRACED = object()


def traced_route(call, x, args, kwargs):
    """For an op without the replay path: the call as a torch custom op while torch.compile
    traces it, or as a buffer callback while JAX traces it (x its first array); else
    NOT_TRACED."""
    if type(x).__module__.startswith("torch"):
        if _compiling(x):
            return _torch_route(call, args, kwargs)
    elif type(x).__module__.startswith(_JAX) and _jax_traced(args, kwargs):
        return JAX_OPS.route(call, args, kwargs)
    return NOT_TRACED


_JAX = ("jax", "jaxlib")
JAX_OPS = None  # _core.jax_ops, imported once a JAX array arrives
JT = None  # JAX's array type (jaxlib's ArrayImpl), set by `_jax_traced`
# device -> (the CuPy stream JAX takes external work from, its handle) and the function
# handing a result to JAX (`arrays.to_jax`); set by _cuda.launch.
JAX_PLACE = JAX_RESULT = None
# replay key -> each output of a JAX call: the byte-code dtype it holds (float8_e4m3fn,
# E8M0), else False; its replay hands the outputs back with those dtypes
_jax_kinds: dict = {}


def _jax_call(op, spec, x, args, kwargs):
    """An eager call whose first array is a JAX array: a C-contiguous one on the current
    CUDA device takes its replay when one is kept (launched on the stream JAX takes
    external work from, after that stream waits for inputs still being computed; results
    handed to JAX as the whole way does), else the whole way."""
    if type(x) is not JT or JAX_PLACE is None:
        return op(*args, **kwargs)
    sharding = x.sharding
    devices = sharding.device_set
    if len(devices) != 1:
        return op(*args, **kwargs)
    dev = next(iter(devices))
    if dev.platform == "cpu":
        return op(*args, **kwargs)
    device = dev.local_hardware_id
    p = x.unsafe_buffer_pointer() if x.size else 0
    ptrs, waits, vals = [p], [x], []
    key = (op, x.shape, x.dtype, p & 15, device)
    if len(args) > 1 or kwargs:
        key = _key_rest(key, ptrs, device, args[1:], kwargs, spec, vals, waits)
        if key is None:
            return op(*args, **kwargs)
    replay = _table.get(key)
    kinds = _jax_kinds.get(key)
    if replay is None or kinds is None or _device() != device:
        result = _first(op, key, args, kwargs)
        if key in _table:
            res = result if isinstance(result, tuple) else (result,)
            if len(_jax_kinds) >= PLAN_LIMIT:
                _jax_kinds.clear()
            _jax_kinds[key] = tuple([r.dtype if r.dtype.name in BYTE_CODES else False
                                     for r in res])
        return result
    stream, handle = JAX_PLACE(device)
    for a in waits:
        if not a.is_ready():
            a.__dlpack__(stream=handle or 1)  # the stream waits for it on the device
    with stream:
        res = replay(stream, ptrs, *vals)
        if isinstance(res, tuple):
            return tuple([JAX_RESULT(device, r, k, waits) for r, k in zip(res, kinds)])
        return JAX_RESULT(device, res, kinds[0], waits)


def _jax_traced(args, kwargs) -> bool:
    """Whether a call whose first array is a JAX one is being traced (by jax.jit)."""
    global JAX_OPS, JT
    if JAX_OPS is None:
        from . import jax_ops

        _PLAIN.add(type(jax_ops.jax.numpy.float32))  # JAX's scalar types (jnp.bfloat16)
        jax_ops.GIVEN_STREAM = GIVEN_STREAM
        JT = jax_ops.ARRAY_TYPE
        JAX_OPS = jax_ops
    return JAX_OPS.traced(args, kwargs)


def _key_rest(key, ptrs, device, args, kwargs, spec, vals, waits=None):
    """The key extended by the arguments after x (their addresses appended to ptrs, the
    run-time values that `spec` names to vals), or None when one of them cannot be in a
    key. JAX arrays are taken when `waits` is given (and appended to it)."""
    for a in args:
        t = type(a)
        if t in _PLAIN:
            key += (t, a)
        else:
            key = _array_key(key, t, a, ptrs, device, waits)
            if key is None:
                return None
    if kwargs:
        order, values = spec
        last = -1
        for name, a in kwargs.items():
            t = type(a)
            if t in _PLAIN:
                test = values.get(name)
                if test is not None and t is int:
                    if not test(a):
                        return None
                    vals.append(a)
                    key += (name, _VALUE)
                else:
                    key += (name, t, a)
                continue
            i = order.get(name, -1)
            if i < last:
                return None
            last = i
            key = _array_key(key + (name,), t, a, ptrs, device, waits)
            if key is None:
                return None
    return key


_VALUE = object()  # in a key: an argument whose value the replay is handed


def _array_key(key, t, a, ptrs, device, waits):
    """The key extended by one argument that is not of a plain type: an array of the call's
    family on its device (its address appended to ptrs), or another plain value; None
    otherwise."""
    if t is ND:
        if not a._c_contiguous or a.data.device_id != device:
            return None
        p = a.data.ptr
        ptrs.append(p)
        return key + (a.shape, a.dtype, p & 15)
    if t is TT:
        if a.get_device() != device or not a.is_contiguous():
            return None
        p = a.data_ptr()
        ptrs.append(p)
        return key + (a.shape, a.dtype, p & 15)
    if t is JT and waits is not None:
        devices = a.sharding.device_set
        if len(devices) != 1:
            return None
        dev = next(iter(devices))
        if dev.platform == "cpu" or dev.local_hardware_id != device:
            return None
        p = a.unsafe_buffer_pointer() if a.size else 0
        ptrs.append(p)
        waits.append(a)
        return key + (a.shape, a.dtype, p & 15)
    if _plain(a):
        return key + (t, a)
    return None


def _first(op, key, args, kwargs):
    """The whole way, keeping the replay the call's one launch offers."""
    outer = getattr(_tls, "offers", None)
    offers = _tls.offers = []
    try:
        result = op(*args, **kwargs)
    finally:
        _tls.offers = outer
        if outer is not None:  # a call inside another: the outer one is not one launch
            outer.append(None)
    if len(offers) == 1 and offers[0] is not None:
        keep(key, offers[0])
    return result


def offer(replay) -> None:
    """A launcher has done a call's work: `replay(stream, ptrs)` does it again for arrays at
    other addresses (ptrs: the addresses of the call's CuPy arrays, in argument order); for
    an op declaring run-time values (`replayable(values=...)`), `replay(stream, ptrs, *values)`
    with those given by name, in their order, and this call's own values by default.
    Call it only where the launch used the arrays as given (no copies)."""
    offers = getattr(_tls, "offers", None)
    if offers is not None:
        offers.append(replay)


def plain(v) -> bool:
    """Whether v can be part of a key."""
    return type(v) in _PLAIN or _plain(v)


def replay_of(key):
    """The replay kept under `key` (built by a caller of its own, e.g. a batch), or None."""
    return _table.get(key)


def keep(key, replay) -> None:
    """Keep `replay` under `key`, for a call that builds its own key (a batch of arrays):
    the caller vouches, as `replayable` does, that the key holds everything its checks and
    plan depended on and that the call made one launch on the arrays as given."""
    if len(_table) >= PLAN_LIMIT:
        _table.clear()
    _table[key] = replay


def current_device() -> int:
    return _device()


def current_stream():
    return _stream()


def clear() -> None:
    """Forget every replay (for anything that changes how plans are made)."""
    _table.clear()
    _jax_kinds.clear()


__all__ = ["replayable", "offer", "enable", "enable_torch", "clear", "plain", "replay_of", "keep",
           "current_device", "current_stream", "PLAN_LIMIT"]
