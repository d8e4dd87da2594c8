"""SmoothQuant under the profiler: head's sources, then the pipelined p5 build (host patch
as in ab_pipelined.diff); bf16 16384 x 7168, each called twice."""
import os, pathlib, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp, ml_dtypes
import cuquant
from cuquant import _symmetric
from benchmarks import harness
_t, _s = _symmetric.smooth_threads, _symmetric.smooth_shared_bytes
rng = np.random.default_rng(1)
K = 7168
x = cp.asarray((rng.standard_normal((16384, K), dtype=np.float32) * np.exp2(rng.integers(-3, 4, K))).astype(ml_dtypes.bfloat16))
smooth = cp.asarray(np.exp2(rng.uniform(-2, 3, K)).astype(np.float32))
for name, d in (("head", "scratch/v_sq5"), ("p5", "scratch/v_pipe5")):
    p5 = name == "p5"
    _symmetric.smooth_threads = (lambda tpg: 512 if tpg in (128, 256) else _t(tpg)) if p5 else _t
    _symmetric.smooth_shared_bytes = (lambda k, th, g: 2 * -(-k // 4) * 16 + th * g[1] * 16 * (3 if g[0] == 128 else 1)) if p5 else _s
    harness.use_sources(pathlib.Path(d).resolve())
    for _ in range(2):
        cuquant.smooth_quant(x, smooth); cp.cuda.Device().synchronize()
    print(name, "done", flush=True)
