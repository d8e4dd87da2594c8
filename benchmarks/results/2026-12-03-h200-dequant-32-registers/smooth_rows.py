"""SmoothQuant's time against the row count (bf16, K = 7168): the fixed part of a call
(tables, first row, tail, launch) from the slope. 528 teams on an H200: 16368 rows are
31 whole rounds, 16384 leave 16 rows for a 32nd."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from cuquant import _registry
from benchmarks import harness

timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw / 1e12:.3f} TB/s", flush=True)
K = 7168
(x, smooth), _ = _registry._smooth(cp, np.random.default_rng(0), (32768, K), "bfloat16")
for rows in (4096, 8192, 12288, 16368, 16384, 16400, 24576, 32768):
    xr = x[:rows]
    call = lambda: cuquant.smooth_quant(xr, smooth)
    call()
    moved = rows * K * 3 + rows * 4 + K * 4
    ts = [timer.time_ms(call, reps=20) for _ in range(3)]
    print(f"{rows:6d} x {K}: " + " / ".join(f"{t * 1e3:7.1f} us {moved / (t * 1e-3) / copy_bw:.3f}" for t in ts), flush=True)
