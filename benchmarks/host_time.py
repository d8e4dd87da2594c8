"""Host time of small calls on CuPy arrays, with repeated calls replayed (the default) and
sent the whole way every time, alternating in one process so that both see the same
state of the host; an empty CuPy launch is measured after each op to show that state.
Each op runs on the CPU where an empty launch was quickest just before (`--any-cpu`: on
whichever CPUs the process has).

    python -m benchmarks.host_time [--ops a,b] [--rounds 4] [--any-cpu]

Each figure is the lowest over rounds of the median of 1000 calls (`harness.host_us_per_call`).
"""

from __future__ import annotations

import argparse

import numpy as np

import op_table
from cuquant._core import arrays as _arrays
from cuquant._core import replay as _fast

from . import harness
from .__main__ import _bench_dtype

SHAPES = ((1, 4096), (16, 4096))


def main():
    p = argparse.ArgumentParser(prog="python -m benchmarks.host_time")
    p.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--any-cpu", action="store_true", help="do not pin to the quietest CPU")
    opts = p.parse_args()
    cp = _arrays.cupy_module()
    replay_on = cp.ndarray
    empty = harness.empty_launch()
    rng = np.random.default_rng(0)
    print(f"{'op':72s} {'shape':>8s} {'whole way':>9s} {'replay':>7s} {'empty launch':>12s} {'CPU':>4s}")
    for op in op_table.all_ops():
        if opts.ops and op.name not in opts.ops.split(","):
            continue
        for variant, shape in [(v, s) for v in op.bench_variants[:1] for s in SHAPES]:
            args, kwargs = op.make(cp, rng, shape, _bench_dtype(op, ""), **variant)
            call = lambda: op.fn(*args, **kwargs)  # noqa: E731
            whole, replayed = [], []
            cpu = None if opts.any_cpu else harness.quietest_cpu(empty)[0]
            with harness.pinned(cpu):
                for _ in range(opts.rounds):
                    _fast.ND = None  # no CuPy type: every call goes the whole way
                    whole.append(harness.host_us_per_call(call, rounds=1))
                    _fast.ND = replay_on
                    replayed.append(harness.host_us_per_call(call, rounds=1))
                empty_us = harness.host_us_per_call(empty, rounds=1)
            name = op.name + (f" ({op.notes.split(';')[0]})" if op.notes else "")
            if variant:
                name += " " + ",".join(f"{k}={v}" for k, v in variant.items())
            print(f"{name[:72]:72s} {'x'.join(map(str, shape)):>8s} {min(whole):9.1f} "
                  f"{min(replayed):7.1f} {empty_us:12.1f} {'' if cpu is None else cpu:>4}",
                  flush=True)


if __name__ == "__main__":
    main()
