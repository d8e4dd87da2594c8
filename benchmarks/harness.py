"""Timing with a cold L2, effective bandwidth and host time (docs/performance.md, "Method").

Kernel time: the L2 is flushed (a buffer larger than L2 is overwritten) before every timed
call, which is bracketed by CUDA events; the median of the repetitions is reported.
Effective bandwidth: bytes of every input read once plus every output written once, over
that time, and as a fraction of the device-to-device copy bandwidth measured in the same
run. Host time: wall-clock time spent inside one call of a small shape, the GPU idle, in
passes spread over the run, each on the CPU where an empty launch is quickest at the time
(`HostTimes`).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time

import numpy as np


def _cp():
    import cupy

    return cupy


class Timer:
    """Cold-L2 event timing on the current CuPy stream. The L2 is flushed by reading a
    buffer four times its size: a flush that writes would leave dirty lines behind whose
    write-back the timed kernel would pay for."""

    def __init__(self, flush_bytes: int | None = None):
        cp = _cp()
        dev = cp.cuda.Device()
        l2 = dev.attributes.get("L2CacheSize", 50 << 20)
        self.flush = cp.ones(max(flush_bytes or 0, 4 * l2) // 4, dtype=cp.float32)
        self.start = cp.cuda.Event()
        self.end = cp.cuda.Event()

    def time_ms(self, fn, reps: int = 30, warmup: int = 3) -> float:
        cp = _cp()
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            self.flush.max()
            self.start.record()
            fn()
            self.end.record()
            self.end.synchronize()
            times.append(cp.cuda.get_elapsed_time(self.start, self.end))
        return statistics.median(times)


def copy_bandwidth(timer: Timer, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    cp = _cp()
    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    ms = timer.time_ms(lambda: cp.copyto(dst, src), reps=20)

    return 2 * nbytes / (ms * 1e-3)


def host_us_per_call(fn, calls: int = 1000, rounds: int = 3) -> float:
    """Host time of one call in microseconds: the wall-clock time spent inside the call,
    each call started with the GPU's queue drained (in untimed code, so that a launch never
    waits for queue space and the GPU's own time is not counted) and its results kept alive
    until the next drain (releasing them is the caller's work, not the call's). The median
    over `calls` calls, the lowest of `rounds` rounds: other work on the host only adds."""
    cp = _cp()
    best = float("inf")
    for _ in range(rounds):
        keep, times = [fn() for _ in range(20)], []
        for i in range(calls):
            if i % 32 == 0:
                cp.cuda.get_current_stream().synchronize()
                keep.clear()
            t0 = time.perf_counter()
            r = fn()
            t1 = time.perf_counter()
            keep.append(r)
            times.append(t1 - t0)
        cp.cuda.get_current_stream().synchronize()
        best = min(best, statistics.median(times) * 1e6)
    return best


def quietest_cpu(probe, calls: int = 200) -> tuple[int | None, float]:
    """The CPU, of those this thread may run on, where `probe` takes least host time now,
    and that time in microseconds; `(None, time)` where threads cannot be pinned.

    On a shared machine a call's host time follows the load other processes put on the CPU
    it runs on, and that load moves between CPUs within seconds. Measured on the quietest
    CPU, host time is the call's own work, as far as one CPU can show it (`HostTimes` repeats the measurement over time)."""
    if not hasattr(os, "sched_setaffinity"):
        return None, host_us_per_call(probe, calls=calls, rounds=1)
    times = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        with pinned(cpu):
            times[cpu] = host_us_per_call(probe, calls=calls, rounds=1)
    cpu = min(times, key=times.get)
    return cpu, times[cpu]


@contextlib.contextmanager
def pinned(cpu: int | None):
    """Run the block with this thread on `cpu` alone, its former CPUs restored after; for
    `None`, as it is."""
    if cpu is None:
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


class HostTimes:
    """Host time of small calls, measured in passes spread over the run.

    A shared machine's CPUs are slowed for seconds at a time by other processes' load, all
    of them together at times, so one measurement
    says as much about that moment as about the call. Each pass measures every call once:
    pinned to the quietest CPU of the moment (`quietest_cpu`), the median of 1000 calls,
    and an empty launch right after on the same CPU to show the host's state. A call's
    host time is its lowest pass, as timeit takes its best repeat, since other work on the
    host only adds; the median over the passes is kept beside it."""

    def __init__(self, probe=None):
        self.probe = probe
        self.calls: dict = {}
        self.samples: dict = {}
        self.bases: dict = {}  # key -> the call it is measured beside (`add_beside`)

    def add(self, key, call) -> None:
        """Measure `call` once (the first pass) and keep it under `key`; a call that raises
        is not kept."""
        self.samples[key] = [self._sample(call, self.bases.get(key))]
        self.calls[key] = call

    def add_beside(self, key, call, base) -> None:
        """As `add`, with `base` (the same call on CuPy arrays) measured in each pass on
        the same CPU, the two alternating: their difference (`result`'s over_us) is free of
        the load of the moment, which a difference of two passes is not."""
        self.bases[key] = base
        self.add(key, call)

    def passes(self, n: int, gap_s: float = 5.0) -> None:
        """`n` more passes over every call kept, `gap_s` seconds apart."""
        for _ in range(n):
            time.sleep(gap_s)
            for key, call in self.calls.items():
                self.samples[key].append(self._sample(call, self.bases.get(key)))

    def _sample(self, call, base=None, rounds: int = 3) -> tuple:
        probe = self.probe or empty_launch()
        cpu, _ = quietest_cpu(probe)
        with pinned(cpu):
            if base is None:
                t, b = host_us_per_call(call, rounds=1), None
            else:  # alternating, each the lowest of its rounds
                ts, bs = [], []
                for _ in range(rounds):
                    bs.append(host_us_per_call(base, rounds=1))
                    ts.append(host_us_per_call(call, rounds=1))
                t, b = min(ts), min(bs)
            empty = host_us_per_call(probe, rounds=1)
        return t, empty, cpu, b

    def result(self, key) -> dict:
        """host_us (the lowest pass), launch_us and host_cpu of that pass, host_median_us
        and launch_median_us (over the passes) and host_passes; for a call measured beside
        a base, over_us: the median over the passes of its host time less the base's."""
        samples = self.samples[key]
        t, empty, cpu, _ = min(samples, key=lambda s: s[0])
        res = {"host_us": t, "launch_us": empty, "host_cpu": cpu,
               "host_median_us": statistics.median(s[0] for s in samples),
               "launch_median_us": statistics.median(s[1] for s in samples),
               "host_passes": len(samples)}
        if key in self.bases:
            res["over_us"] = statistics.median(s[0] - s[3] for s in samples)
        return res


_EMPTY = None


def empty_launch():
    """A call that launches an empty CuPy kernel with no arguments: its host time, measured
    beside an op's, shows the state of the host."""
    global _EMPTY
    if _EMPTY is None:
        k = _cp().RawKernel('extern "C" __global__ void empty() {}', "empty")
        _EMPTY = lambda: k((1,), (1,), ())  # noqa: E731
    return _EMPTY


def wall_us(fn, reps: int = 15) -> float:
    """Median wall-clock microseconds of one call, synchronized: host work included."""
    cp = _cp()
    fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        cp.cuda.get_current_stream().synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def nbytes(obj) -> int:
    """Bytes of every array in obj (arrays, tuples, lists), anything with .nbytes."""
    if isinstance(obj, (tuple, list)):
        return sum(nbytes(o) for o in obj)
    n = getattr(obj, "nbytes", None)
    if n is None:
        return 0
    return int(n() if callable(n) else n)


def bytes_moved(op, args, kwargs, out) -> tuple[int, int]:
    """(bytes the op really moves, logical bytes) of one call, as docs/performance.md counts
    them: every input read once (keyword arrays, such as the caller's random words, too)
    and every output written once; the op's own `moved` where it reads more (per-tensor
    dynamic reads its input twice)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    logical = nbytes(list(args) + list(kwargs.values())) + nbytes(list(outs))
    return (op.moved(args, kwargs, outs) if op.moved else logical), logical


def to_torch(obj):
    """CuPy or NumPy arrays, in lists and tuples too, as torch tensors on their device
    (zero copy, cuquant's own conversion); dtype names as torch dtypes."""
    import torch

    from cuquant._core.arrays import as_torch

    if isinstance(obj, (tuple, list)):
        return type(obj)(to_torch(o) for o in obj)
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        return as_torch(obj)
    if isinstance(obj, str):
        return getattr(torch, obj)
    return obj


def back_to_back_us(*fns, calls: int = 100, reps: int = 12) -> list[float]:
    """Microseconds a call of `calls` calls made back to back (no L2 flush between them)
    with one device synchronization at the end: the longer of the host's and the GPU's
    time, whichever bounds a stream of calls. The median over `reps`, for each of `fns`.
    Their repetitions take turns, the order reversed every other round (A B, B A, ...):
    the GPU's clocks drift under a long load, and in a fixed order that drift falls on the
    later function every round."""
    cp = _cp()
    dev = cp.cuda.Device()
    for fn in fns:
        fn()
    dev.synchronize()
    times: list = [[] for _ in fns]
    order = list(zip(fns, times))
    for r in range(reps):
        for fn, t in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            dev.synchronize()
            t.append((time.perf_counter() - t0) / calls)
    return [statistics.median(t) * 1e6 for t in times]


def arrays_as(obj, convert):
    """obj (an op's arguments: arrays in lists, tuples and dicts) with every CuPy array
    converted by `convert`, everything else as it is."""
    if isinstance(obj, (tuple, list)):
        return type(obj)(arrays_as(o, convert) for o in obj)
    if isinstance(obj, dict):
        return {k: arrays_as(v, convert) for k, v in obj.items()}
    if hasattr(obj, "__cuda_array_interface__"):
        return convert(obj)
    return obj


def cupy_to_torch(a, fp8: bool = False):
    """A CuPy array as a torch CUDA tensor of its own (a copy), fp8 codes as float8_e4m3fn
    when `fp8`."""
    import torch

    from cuquant._core.arrays import as_torch

    t = as_torch(a).clone()
    return t.view(torch.float8_e4m3fn) if fp8 and t.dtype == torch.uint8 else t


def cupy_to_jax(a, fp8: bool = False):
    """A CuPy array as a JAX array on the first GPU (through the host), fp8 codes as
    float8_e4m3fn when `fp8`."""
    import jax

    h = a.get()
    if fp8 and h.dtype == np.uint8:
        import ml_dtypes

        h = h.view(ml_dtypes.float8_e4m3fn)
    return jax.device_put(h, jax.devices("gpu")[0])
