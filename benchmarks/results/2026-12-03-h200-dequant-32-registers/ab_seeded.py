"""Probes of seeded stochastic rounding's ceiling (zero point, tile kernel of its own):
head the committed sources; hash: one multiply and an xor a word in place of Philox
(a probe, not a generator: outputs differ); p7: Philox4x32-7. fp16 16384 x 7168 unless
said, x copy counting x, q, scales, zeros and the reconstruction."""
import os, pathlib, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from benchmarks import harness

here = pathlib.Path(os.path.dirname(os.path.abspath(__file__)))
names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["head", "hash", "p7"]
loaded = [None]


def use(name):
    if loaded[0] != name:
        harness.use_sources(here / name)
        loaded[0] = name
    harness.forget_plans()


timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw / 1e12:.3f} TB/s  {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
rng = np.random.default_rng(0)


def report(label, call, inputs):
    out = call()
    moved = sum(a.nbytes for a in inputs) + sum(o.nbytes for o in out)
    times, notes = harness.time_variants(names, use, call, timer, rounds=3, reps=15)
    cells = "  ".join(f"{n} " + "/".join(f"{moved / (t * 1e-3) / copy_bw:.3f}" for t in ts)
                      for n, ts in times.items())
    print(f"{label:30s} {cells}  {len(notes)} DIFF notes", flush=True)


x16 = cp.asarray(rng.standard_normal((16384, 7168), dtype=np.float32))
x = x16.astype(np.float16)
for bits, g in ((4, 128), (8, 128), (4, 32)):
    report(f"seeded {bits}-bit G={g}",
           lambda: cuquant.quantize_groupwise_zero_point(x, bits, g, rounding="stochastic", seed=7), [x])
report("nearest 4-bit G=128", lambda: cuquant.quantize_groupwise_zero_point(x, 4, 128), [x])
