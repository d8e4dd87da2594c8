"""A/B of the zero point's seeded stochastic rounding across source variants, from the
repository root: python abzp.py name=dir ... Every output compared bit for bit with the
first variant's (DIFF). A name holding k4 plans 4 units a lane. fp16/bf16, x copy counting
x and the four outputs."""
import os, pathlib, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp, ml_dtypes
import cuquant
from cuquant import groupwise
from benchmarks import harness

dirs = {k: pathlib.Path(v).resolve() for k, v in (a.split("=", 1) for a in sys.argv[1:] if "=" in a)}
print({k: v.name for k, v in dirs.items()})
rounds = int(os.environ.get("AB_ROUNDS", "3"))
def use(name):
    groupwise.TILES["units_per_lane"] = 4 if "k4" in name else 8
    harness.use_sources(dirs[name])
timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw/1e12:.3f} TB/s", flush=True)
rng = np.random.default_rng(0)
for dt, bits, g in [(np.float16, 4, 128), (np.float16, 8, 128), (ml_dtypes.bfloat16, 4, 128),
                    (np.float16, 4, 32), (np.float16, 4, 256), (np.float16, 8, 32)]:
    x = cp.asarray(rng.standard_normal((16384, 7168), dtype=np.float32).astype(dt))
    call = lambda: cuquant.quantize_groupwise_zero_point(x, bits=bits, group_size=g, rounding="stochastic", seed=12345)
    first = next(iter(dirs)); use(first)
    out = call()
    want = [o.view(f"u{o.dtype.itemsize}").copy() for o in out]
    moved = x.nbytes + sum(o.nbytes for o in out)
    cells = {k: [] for k in dirs}; notes = set()
    for _ in range(rounds):
        for v in dirs:
            use(v)
            got = call()
            for i, (a, b) in enumerate(zip(got, want)):
                if not bool(cp.array_equal(a.view(f"u{a.dtype.itemsize}"), b)):
                    notes.add(f"DIFF {v} output {i}")
            ms = timer.time_ms(call, reps=15)
            cells[v].append(f"{ms*1e3:.1f} ({moved / (ms * 1e-3) / copy_bw:.3f})")
    print(f"{np.dtype(dt).name} {bits}-bit G={g}:", " | ".join(f"{k}: {' '.join(c)}" for k, c in cells.items()), " ".join(sorted(notes)), flush=True)
    del x, out, want
    cp.get_default_memory_pool().free_all_blocks()
