"""Sweep of the staged group quantizer's geometry at the headline shape: for every
group-wise quantizer, the register-held kernel and the staged one under each (stage size,
shared memory per block) pair, with the library's choice of kernel and units a thread
("policy") and with one pass and a fixed number of units a thread, as a fraction of the
copy bandwidth, cold L2. (The zero-point format keeps its own units a thread.)

    python -m benchmarks.stage_sweep [--ops a,b] [--configs 32768:98304] [--holds 2,4]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from cuquant import _registry, groupwise

from . import harness
from .__main__ import _bench_dtype

DEFAULT_CONFIGS = "16384:114688,24576:98304,32768:98304,32768:196608"


def main():
    p = argparse.ArgumentParser(prog="python -m benchmarks.stage_sweep")
    p.add_argument("--ops", default="")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="stage_bytes:smem_per_block pairs, comma-separated")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--holds", default="2,4", help="vectors a consumer thread holds")
    opts = p.parse_args()
    import cupy as cp

    timer = harness.Timer()
    copy_bw = harness.copy_bandwidth(timer)
    print(f"# copy bandwidth {copy_bw / 1e12:.3f} TB/s")
    configs = [tuple(int(v) for v in c.split(":")) for c in opts.configs.split(",") if c]
    saved = dict(groupwise.STAGED)
    rng = np.random.default_rng(0)
    names = opts.ops.split(",") if opts.ops else None
    for op in _registry.all_ops():
        if op.kind != "quantize" or op.family not in ("groupwise", "zero_point") or (
                names and op.name not in names):
            continue
        dtype = _bench_dtype(op, "")
        for variant in op.bench_variants:
            args, kwargs = op.make(cp, rng, _registry.HEADLINE, dtype, **variant)
            call = lambda: op.fn(*args, **kwargs)  # noqa: E731
            out = call()
            moved, _ = harness.bytes_moved(op, args, kwargs, out)
            cells = []
            variants = [("held", {"min_bytes": 1 << 62})]
            for sb, smem in configs:
                variants.append((f"policy {sb // 1024}K/{smem // 1024}K",
                                 {"stage_bytes": sb, "smem_per_block": smem}))
                for h in (int(v) for v in opts.holds.split(",")):
                    variants.append((f"h{h} {sb // 1024}K/{smem // 1024}K",
                                     {"stage_bytes": sb, "smem_per_block": smem, "hold": h,
                                      "hold_large": h, "two_pass": False}))
            for label, cfg in variants:
                groupwise.STAGED.update(saved)
                groupwise.STAGED.update(cfg)
                harness.forget_plans()
                try:
                    ms = timer.time_ms(call, reps=opts.reps)
                    cells.append(f"{label} {moved / (ms * 1e-3) / copy_bw:.3f}")
                except Exception as e:  # noqa: BLE001 - report and go on
                    cells.append(f"{label} {type(e).__name__}: {e}"[:120])
            groupwise.STAGED.update(saved)
            harness.forget_plans()
            print(f"{op.name} {json.dumps(variant)} {dtype}: " + " | ".join(cells), flush=True)
            del args, kwargs, out
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
