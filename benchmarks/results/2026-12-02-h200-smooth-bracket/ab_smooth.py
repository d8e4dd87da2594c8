"""A/B of SmoothQuant sources, run from the repository root:
python benchmarks/results/2026-12-02-h200-smooth-bracket/ab_smooth.py name=dir ...
Every code and scale of each variant is compared bit for bit with the first's (DIFF).
Microseconds and x copy, counting x, q, scale and smooth."""
import os, pathlib, sys
sys.path.insert(0, os.getcwd())
import numpy as np
import cupy as cp
import ml_dtypes
import cuquant
from cuquant import _symmetric
from benchmarks import harness

dirs = {k: pathlib.Path(v).resolve() for k, v in (a.split("=", 1) for a in sys.argv[1:] if "=" in a)}
print({k: v.name for k, v in dirs.items()})
rounds = int(os.environ.get("AB_ROUNDS", "2"))
only = os.environ.get("AB_ONLY", "")

_orig_plan = _symmetric._smooth_plan
def _balanced_plan(key, t, code, rows, k, vec, geom, threads, smem, device):
    # as many row rounds as the resident grid needs, spread evenly over the teams
    plan = _orig_plan(key, t, code, rows, k, vec, geom, threads, smem, device)
    slots = threads // geom[0]
    rounds_ = -(-rows // (plan.grid * slots))
    plan.grid = -(-(-(-rows // rounds_)) // slots)
    return plan
def use(name):
    _symmetric._smooth_plan = _balanced_plan if name.endswith("bal") else _orig_plan
    harness.use_sources(dirs[name])

def make(kind, M, K, dt):
    rng = np.random.default_rng(1)
    colscale = np.exp2(rng.integers(-3, 4, K)).astype(np.float32)
    x = (rng.standard_normal((M, K), dtype=np.float32) * colscale)
    smooth = np.exp2(rng.uniform(-2, 3, K)).astype(np.float32)
    if kind == "fin" and M > 5:
        x[1, 5] = np.nan; x[2, 7] = np.inf; x[3] = 0; x[4] *= 2.0 ** -120; x[5] *= 2.0 ** 105
    if kind == "zeros":
        x[::2] = 0
    if kind == "ties":
        smooth[:] = 1
        x[:, 0] = 127
        x[:, 1::2] = np.floor(x[:, 1::2] * 8) % 100 + 0.5
    xd = cp.asarray(x.astype(dt))
    return xd, cp.asarray(smooth)

cases = [("rand", 16384, 7168, ml_dtypes.bfloat16), ("fin", 16384, 7168, ml_dtypes.bfloat16),
         ("fin", 16384, 7168, np.float16), ("fin", 8192, 14336, ml_dtypes.bfloat16),
         ("fin", 16384, 4096, ml_dtypes.bfloat16), ("fin", 16384, 7160, ml_dtypes.bfloat16),
         ("fin", 8192, 7168, ml_dtypes.bfloat16), ("fin", 2048, 4096, ml_dtypes.bfloat16),
         ("zeros", 16384, 7168, ml_dtypes.bfloat16), ("ties", 16384, 7168, ml_dtypes.bfloat16),
         ("fin", 16384, 7168, np.float32), ("fin", 4096, 1000, ml_dtypes.bfloat16),
         ("fin", 1, 7168, ml_dtypes.bfloat16)]
timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw/1e12:.3f} TB/s", flush=True)
for kind, M, K, dt in cases:
    name = f"{np.dtype(dt).name}-{kind} {M:6d} x {K:5d}"
    if only and only not in name:
        continue
    x, smooth = make(kind, M, K, dt)
    call = lambda: cuquant.smooth_quant(x, smooth)
    moved = x.nbytes + x.size + 4 * M + 4 * K
    first = next(iter(dirs))
    use(first)
    want = [o.view(f"u{o.dtype.itemsize}").copy() for o in call()]
    cells = {k: [] for k in dirs}
    notes = set()
    for _ in range(rounds):
        for v in dirs:
            use(v)
            got = call()
            for i, (a, b) in enumerate(zip(got, want)):
                if not bool(cp.array_equal(a.view(f"u{a.dtype.itemsize}"), b)):
                    notes.add(f"DIFF {v} output {i}")
            ms = timer.time_ms(call, reps=20)
            cells[v].append(f"{ms*1e3:.1f} ({moved / (ms * 1e-3) / copy_bw:.3f})")
    print(f"{name:28s}", " | ".join(f"{k}: {' '.join(c)}" for k, c in cells.items()), " ".join(sorted(notes)), flush=True)
    del x, smooth, want
    cp.get_default_memory_pool().free_all_blocks()
