"""A/B of the zero point's seeded stochastic rounding across source variants, from the
repository root: python ab_zp_seeded.py name=dir ... Every output compared bit for bit
with the first variant's (DIFF). A name holding k4 plans 4 units a lane. 16384 x 7168,
x copy counting x and the four outputs."""
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
CASES = [("stochastic", np.float16, 4, 128), ("stochastic", np.float16, 8, 128),
         ("stochastic", ml_dtypes.bfloat16, 4, 128), ("stochastic", np.float16, 4, 32),
         ("stochastic", np.float16, 4, 256), ("stochastic", np.float16, 8, 32)]
for rounding, dt, bits, g in CASES:
    x = cp.asarray(rng.standard_normal((16384, 7168), dtype=np.float32).astype(dt))
    seed = 12345 if rounding == "stochastic" else None
    call = lambda: cuquant.quantize_groupwise_zero_point(x, bits=bits, group_size=g, rounding=rounding, seed=seed)
    moved = x.nbytes + sum(o.nbytes for o in call())
    times, notes = harness.time_variants(dirs, use, call, timer, rounds, reps=15)
    cells = {k: " ".join(f"{ms*1e3:.1f} ({moved / (ms * 1e-3) / copy_bw:.3f})" for ms in v) for k, v in times.items()}
    print(f"{rounding} {np.dtype(dt).name} {bits}-bit G={g}:", " | ".join(f"{k}: {c}" for k, c in cells.items()), " ".join(notes), flush=True)
    del x
    cp.get_default_memory_pool().free_all_blocks()
