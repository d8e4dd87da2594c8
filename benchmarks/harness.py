"""Timing with a cold L2 and the numbers SPEC section 8 asks for.

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
import pathlib
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
    it runs on, and that load moves between CPUs within seconds (`benchmarks/NOTES.md`,
    "Host time"). Measured on the quietest CPU, host time is the call's own work, as far as
    one CPU can show it (`HostTimes` repeats the measurement over time)."""
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
    of them together at times (`benchmarks/NOTES.md`, "Host time"), so one measurement
    says as much about that moment as about the call. Each pass measures every call once:
    pinned to the quietest CPU of the moment (`quietest_cpu`), the median of 1000 calls,
    and an empty launch right after on the same CPU to show the host's state. A call's
    host time is its lowest pass, as timeit takes its best repeat, since other work on the
    host only adds; the median over the passes is kept beside it."""

    def __init__(self, probe=None):
        self.probe = probe
        self.calls: dict = {}
        self.samples: dict = {}

    def add(self, key, call) -> None:
        """Measure `call` once (the first pass) and keep it under `key`; a call that raises
        is not kept."""
        self.samples[key] = [self._sample(call)]
        self.calls[key] = call

    def passes(self, n: int, gap_s: float = 5.0) -> None:
        """`n` more passes over every call kept, `gap_s` seconds apart."""
        for _ in range(n):
            time.sleep(gap_s)
            for key, call in self.calls.items():
                self.samples[key].append(self._sample(call))

    def _sample(self, call) -> tuple:
        probe = self.probe or empty_launch()
        cpu, _ = quietest_cpu(probe)
        with pinned(cpu):
            t = host_us_per_call(call, rounds=1)
            empty = host_us_per_call(probe, rounds=1)
        return t, empty, cpu

    def result(self, key) -> dict:
        """host_us (the lowest pass), launch_us and host_cpu of that pass, host_median_us
        and launch_median_us (over the passes) and host_passes."""
        samples = self.samples[key]
        t, empty, cpu = min(samples, key=lambda s: s[0])
        return {"host_us": t, "launch_us": empty, "host_cpu": cpu,
                "host_median_us": statistics.median(s[0] for s in samples),
                "launch_median_us": statistics.median(s[1] for s in samples),
                "host_passes": len(samples)}


_EMPTY = None


def empty_launch():
    """A call that launches an empty CuPy kernel with no arguments: its host time, measured
    beside an op's, shows the state of the host (SPEC section 8 cites about 7.5 us)."""
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
    """(bytes the op really moves, logical bytes) of one call, as SPEC section 8 counts
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

    from cuquant._arrays import as_torch

    if isinstance(obj, (tuple, list)):
        return type(obj)(to_torch(o) for o in obj)
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        return as_torch(obj)
    if isinstance(obj, str):
        return getattr(torch, obj)
    return obj


def forget_plans() -> None:
    """Drop every launch plan and kept replay, so that the next call of each op plans
    afresh: after a change to a plan table (groupwise.TILES, STAGED) or to the sources."""
    from cuquant import _fast, _symmetric, groupwise

    _symmetric._plans.clear()
    groupwise._plans.clear()
    _fast.clear()  # a kept replay would run the plan it was made with


_shipped_sources = None


def use_sources(folder=None) -> None:
    """Build kernels from `folder` (a copy of cuda_src) from now on, or from the shipped
    sources again with None: A/B runs of source variants in one process. The loader's
    caches, the occupancy table and every plan (forget_plans) are cleared, so the next call
    of every op compiles and plans afresh."""
    global _shipped_sources
    from cuquant import _gpu, _kernels

    if _shipped_sources is None:
        _shipped_sources = _kernels.source_dir
    _kernels.source_dir = _shipped_sources if folder is None else (lambda: folder)
    _kernels.source.cache_clear()
    _kernels._functions.clear()
    _gpu._occupancy.clear()
    forget_plans()


def time_variants(names, use, call, timer, rounds: int = 3, reps: int = 15):
    """A/B of variants in one process: use(name) loads one (use_sources, a plan table...),
    call() runs the op and returns its outputs. The first name's outputs are the reference;
    each round loads every name in turn, compares its outputs with the reference bit for
    bit and times the call. Returns ({name: [ms a round]}, sorted 'DIFF name output i'
    notes)."""
    names = list(names)

    def words(out):
        outs = out if isinstance(out, tuple) else (out,)
        return [o.view(f"u{o.dtype.itemsize}") for o in outs]

    use(names[0])
    want = [w.copy() for w in words(call())]
    times: dict = {name: [] for name in names}
    notes = set()
    for _ in range(rounds):
        for name in names:
            use(name)
            for i, (a, b) in enumerate(zip(words(call()), want)):
                if a.shape != b.shape or not bool((a == b).all()):
                    notes.add(f"DIFF {name} output {i}")
            times[name].append(timer.time_ms(call, reps=reps))
    return times, sorted(notes)


def smooth_input(xp, rng, rows: int, k: int, dtype: str = "bfloat16", special: bool = False):
    """SmoothQuant's input for A/B runs: (x [rows, k], smooth [k]) as the op's declaration
    makes them. With `special` (rows >= 18), rows that take the kernel's second division:
    a NaN, an infinity, a zero row, a tiny row (in float16 the smallest subnormals, with
    x's signs) and, but in float16, a huge one."""
    from cuquant import _registry

    (x, smooth), _ = _registry._smooth(xp, rng, (rows, k), dtype)
    if special:
        x[3, 5] = np.nan
        x[7, 1] = np.inf
        x[11] = 0
        if dtype == "float16":
            x[13] = xp.where(x[13] < 0, -(2.0 ** -24), 2.0 ** -24).astype(x.dtype)
        else:
            x[13] = x[13] * 1e-30
            x[17] = x[17] * 1e30
    return x, smooth


class SourceAB:
    """A/B runs of source variants, each a copy of cuda_src in a folder of `names` under
    `folder`, in one process. Measures and prints the copy bandwidth first (unless given);
    `report(label, call, inputs)` times call() under every variant (`time_variants`: the
    first name's outputs are the reference) and prints one line: each round's effective
    bandwidth over the copy bandwidth, counting `inputs` and call()'s outputs, then any
    DIFF notes."""

    def __init__(self, folder, names, rounds: int = 3, reps: int = 15, timer=None,
                 copy_bw: float | None = None, out=print):
        self.folder, self.names = pathlib.Path(folder), list(names)
        self.rounds, self.reps, self.out = rounds, reps, out
        self.timer = timer if timer is not None else Timer()
        if copy_bw is None:
            cp = _cp()
            copy_bw = copy_bandwidth(self.timer)
            name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
            out(f"copy {copy_bw / 1e12:.3f} TB/s  {name}", flush=True)
        self.copy_bw = copy_bw

    @classmethod
    def for_script(cls, script, names, **kw) -> "SourceAB":
        """The A/B runs of a results folder's script: the variants are folders beside
        `script`, the names given as its first argument (comma-separated; else `names`),
        the rounds as AB_ROUNDS (default 3)."""
        import sys

        chosen = sys.argv[1].split(",") if len(sys.argv) > 1 else list(names)
        return cls(pathlib.Path(os.path.abspath(script)).parent, chosen,
                   rounds=int(os.environ.get("AB_ROUNDS", "3")), **kw)

    def use(self, name) -> None:
        """Builds from the folder `name` (kept while it is the loader's), plans afresh."""
        from cuquant import _kernels

        if _kernels.source_dir() != self.folder / name:
            use_sources(self.folder / name)
        forget_plans()

    def report(self, label: str, call, inputs) -> dict:
        """Prints and returns {name: [fraction of copy a round]}."""
        self.use(self.names[0])  # outputs sized under the reference, not whatever is loaded
        moved = nbytes(list(inputs)) + nbytes(call())
        times, notes = time_variants(self.names, self.use, call, self.timer, rounds=self.rounds,
                                     reps=self.reps)
        fractions = {n: [moved / (ms * 1e-3) / self.copy_bw for ms in ts] for n, ts in times.items()}
        cells = "  ".join(f"{n} " + "/".join(f"{f:.3f}" for f in fs) for n, fs in fractions.items())
        self.out(f"{label:34s} {cells}  {' '.join(notes)}", flush=True)
        return fractions
