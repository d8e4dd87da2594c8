"""The tile quantizer (groupwise.TILES, quantize_groups_tiles in cuda_src/groups.cuh)
against the plan with it off at the headline shape: for every group-wise and zero-point
quantizer, the kernel that plan takes (staged, for groups of 2-32 units and large inputs)
and the tile kernel with each number of units a lane, as a fraction of the copy bandwidth,
cold L2, alternating over rounds so that both see the same state of the device. Every
output of every variant is compared with the tiles-off plan's bit for bit; a difference is
printed as DIFF.

    python -m benchmarks.tile_sweep [--ops a,b] [--groups 32,128] [--lanes 16,8,4] [--rounds 2]
                                    [--set rounding=stochastic --set source=rbits]
"""

from __future__ import annotations

import argparse

import numpy as np

from cuquant import _registry, groupwise

from . import harness
from .__main__ import _bench_dtype


def _configure(units_per_lane: int) -> None:
    """0: the plan with the tiles off; otherwise tiles with that many units a lane."""
    groupwise.TILES["on"] = units_per_lane > 0
    if units_per_lane:
        groupwise.TILES["units_per_lane"] = units_per_lane
    harness.forget_plans()


def _bits(out):
    """The outputs' bits, kept on the device (compared there, as unsigned integers)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o.view(f"u{o.dtype.itemsize}") for o in outs]


def main():
    p = argparse.ArgumentParser(prog="python -m benchmarks.tile_sweep")
    p.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    p.add_argument("--groups", default="", help="group sizes in place of the benchmark's")
    p.add_argument("--lanes", default="16,8,4", help="units a lane of the tile kernel")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a variant setting in place of the benchmark's (e.g. source=rbits)")
    opts = p.parse_args()
    import cupy as cp

    timer = harness.Timer()
    copy_bw = harness.copy_bandwidth(timer)
    print(f"# copy bandwidth {copy_bw / 1e12:.3f} TB/s")
    saved = dict(groupwise.TILES)
    configs = [0] + [int(v) for v in opts.lanes.split(",") if v]
    rng = np.random.default_rng(0)
    names = opts.ops.split(",") if opts.ops else None
    groups = [int(g) for g in opts.groups.split(",") if g]
    for op in _registry.all_ops():
        if op.kind != "quantize" or op.family not in ("groupwise", "zero_point") or (
                names and op.name not in names):
            continue
        dtype = _bench_dtype(op, "")
        variants = op.bench_variants
        if groups:
            variants = [{**v, "group_size": g} for v in variants for g in groups]
        if opts.set:
            variants = [{**v, **dict(kv.split("=", 1) for kv in opts.set)} for v in variants]
        variants = list({repr(d): d for d in variants}.values())
        for variant in variants:
            args, kwargs = op.make(cp, rng, _registry.HEADLINE, dtype, **variant)
            call = lambda: op.fn(*args, **kwargs)  # noqa: E731
            _configure(0)
            out = call()
            want = _bits(out)
            moved, _ = harness.bytes_moved(op, args, kwargs, out)
            del out
            cells = {c: [] for c in configs}
            notes = []
            for _ in range(opts.rounds):
                for c in configs:
                    _configure(c)
                    try:
                        got = _bits(call())
                        diff = [i for i, (a, b) in enumerate(zip(got, want))
                                if not bool(cp.array_equal(a, b))]
                        if diff:
                            notes.append(f"DIFF lanes={c} outputs {diff}")
                        del got
                        ms = timer.time_ms(call, reps=opts.reps)
                        cells[c].append(f"{moved / (ms * 1e-3) / copy_bw:.3f}")
                    except Exception as e:  # noqa: BLE001 - report and go on
                        cells[c].append(f"{type(e).__name__}: {e}"[:100])
            groupwise.TILES.update(saved)
            harness.forget_plans()
            line = " | ".join(("tiles off" if c == 0 else f"tiles k{c}") + " " + "/".join(v)
                              for c, v in cells.items())
            print(f"{op.name} {op.notes.split(';')[0]} {variant} {dtype}: {line}"
                  + ("  " + "; ".join(sorted(set(notes))) if notes else ""), flush=True)
            del args, kwargs, want
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
