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
arrays on the current device and stream take this path, and only plain values (numbers,
strings, dtypes, tuples of them, and values of a type that declares `__replay_plain__`:
immutable and compared by value, as the kernel policy) beside them; anything else goes the
whole way every time.
A replay is only ever left behind by a call that passed every check and made exactly one
launch with the arrays as given (no copies), so a key reaches only work that call did."""

from __future__ import annotations

import functools
import threading

import numpy as np

from .dask import call as dask_call, is_dask

PLAN_LIMIT = 4096  # replays kept; past that the table starts over (as the launch plan tables)

_table: dict = {}  # key -> replay
_tls = threading.local()

# CuPy's ndarray, getDevice and get_current_stream, set by `enable` once CuPy is imported.
ND = None
_device = _stream = None

# Types of the arguments besides arrays that a key may hold (and NumPy dtypes): values that
# compare equal only when they mean the same, once their type is in the key too.
_PLAIN = frozenset((int, float, str, bool, type(None), type))


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


def replayable(op):
    """Give the public op `op(x, ..., stream=None)` the replay path (x given by position)."""

    @functools.wraps(op)
    def call(*args, stream=None, **kwargs):
        if stream is not None or not args:
            if args and is_dask(args[0]):
                return dask_call(call, op.__name__, args, dict(kwargs, stream=stream))
            return op(*args, stream=stream, **kwargs)
        x = args[0]
        if type(x) is not ND or not x._c_contiguous:
            if is_dask(x):  # chunk by chunk, each through this op
                return dask_call(call, op.__name__, args, kwargs)
            return op(*args, **kwargs)
        args = args[1:]
        d = x.data
        device = d.device_id
        ptrs = [d.ptr]
        key = (op, x.shape, x.dtype, ptrs[0] & 15, device)
        if args or kwargs:
            key = _key_rest(key, ptrs, device, args, kwargs)
            if key is None:
                return op(x, *args, **kwargs)
        replay = _table.get(key)
        if replay is not None and _device() == device:
            return replay(_stream(), ptrs)
        return _first(op, key, (x,) + args, kwargs)

    return call


def _key_rest(key, ptrs, device, args, kwargs):
    """The key extended by the arguments after x (their addresses appended to ptrs), or
    None when one of them cannot be in a key."""
    for a in args:
        t = type(a)
        if t in _PLAIN:
            key += (t, a)
        elif t is ND:
            if not a._c_contiguous or a.data.device_id != device:
                return None
            p = a.data.ptr
            ptrs.append(p)
            key += (a.shape, a.dtype, p & 15)
        elif _plain(a):
            key += (t, a)
        else:
            return None
    for name, a in kwargs.items():
        t = type(a)
        if t not in _PLAIN and not _plain(a):
            return None
        key += (name, t, a)
    return key


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
    other addresses (ptrs: the addresses of the call's CuPy arrays, in argument order).
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


__all__ = ["replayable", "offer", "enable", "clear", "plain", "replay_of", "keep",
           "current_device", "current_stream", "PLAN_LIMIT"]
