"""A/B of cuda_src variants, run from the repository root:
    python ab_variants.py name=dir ... ; every output of each variant compared bit for bit
    with the first one's (DIFF), fp16 16384x7168, x copy. A name ending in np plans the tile
    kernel a warp a tile; one holding k4, 4 units a lane; one holding t128, 128-thread blocks.
    AB_OPS, AB_G (group sizes), AB_ROUNDS, AB_ONLY choose what runs."""
import os, pathlib, sys
import numpy as np
import cupy as cp
from cuquant import _fast, _gpu, _kernels, _registry, groupwise
from benchmarks import harness
from benchmarks.__main__ import _bench_dtype

dirs = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
dirs = {k: pathlib.Path(v).resolve() for k, v in dirs.items()}
print({k: str(v) for k, v in dirs.items()})
ops_want = os.environ.get("AB_OPS", "quantize_groupwise_zero_point,quantize_groupwise").split(",")
rounds = int(os.environ.get("AB_ROUNDS", "2"))
only = os.environ.get("AB_ONLY", "")   # e.g. "bits=8" to filter variants by text
_orig_plan = groupwise._quant_tile_plan
def _np_plan(*a, **k):
    p = _orig_plan(*a, **k)
    return p[:3] + (1 << 30,)
def use(name):
    groupwise.TILE_THREADS = 128 if "t128" in name else 256
    groupwise.TILES["units_per_lane"] = 4 if "k4" in name else 8
    groupwise._quant_tile_plan = _np_plan if name.endswith("np") else _orig_plan
    _kernels.source_dir = (lambda d=dirs[name]: d)
    _kernels.source.cache_clear()
    _kernels._functions.clear()
    groupwise._plans.clear()
    _gpu._occupancy.clear()
    _fast.clear()
timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw/1e12:.3f} TB/s", flush=True)
rng = np.random.default_rng(0)
for op in _registry.all_ops():
    if op.name not in ops_want:
        continue
    gs = [int(g) for g in os.environ.get("AB_G", "128").split(",")]
    cases = [dict(v, group_size=g) for v in op.bench_variants if v.get("group_size") == 128 for g in gs]
    for variant in cases:
        if only and only not in repr(variant):
            continue
        args, kwargs = op.make(cp, rng, _registry.HEADLINE, _bench_dtype(op, ""), **variant)
        call = lambda: op.fn(*args, **kwargs)
        first = next(iter(dirs))
        use(first)
        out = call(); outs = out if isinstance(out, tuple) else (out,)
        want = [o.view(f"u{o.dtype.itemsize}").copy() for o in outs]
        moved = harness.bytes_moved(op, args, kwargs, out)[0]
        cells = {k: [] for k in dirs}
        notes = set()
        for _ in range(rounds):
            for name in dirs:
                use(name)
                got = call(); got = got if isinstance(got, tuple) else (got,)
                for i, (a, b) in enumerate(zip(got, want)):
                    if not bool(cp.array_equal(a.view(f"u{a.dtype.itemsize}"), b)):
                        notes.add(f"DIFF {name} output {i}")
                ms = timer.time_ms(call, reps=15)
                cells[name].append(f"{moved / (ms * 1e-3) / copy_bw:.3f}")
        print(op.name, variant, " | ".join(f"{k} {'/'.join(v)}" for k, v in cells.items()), " ".join(sorted(notes)), flush=True)
        del args, kwargs, out, outs, want
        cp.get_default_memory_pool().free_all_blocks()
