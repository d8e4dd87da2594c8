"""One call each of SmoothQuant (bf16 16384 x 7168), the zero point's seeded 4-bit rounding
and DeepSpeed's 4-bit dequantizer (fp16 16384 x 7168, G=128), for per-instruction stall
sampling under ncu."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp, ml_dtypes
import cuquant
which = sys.argv[1]
rng = np.random.default_rng(1)
K = 7168
if which == "sq":
    x = cp.asarray((rng.standard_normal((16384, K), dtype=np.float32) * np.exp2(rng.integers(-3, 4, K))).astype(ml_dtypes.bfloat16))
    smooth = cp.asarray(np.exp2(rng.uniform(-2, 3, K)).astype(np.float32))
    for _ in range(2): cuquant.smooth_quant(x, smooth)
elif which == "zp":
    x = cp.asarray(rng.standard_normal((16384, K), dtype=np.float32).astype(np.float16))
    for _ in range(2): cuquant.quantize_groupwise_zero_point(x, bits=4, group_size=128, rounding="stochastic", seed=5)
elif which == "dq":
    x = cp.asarray(rng.standard_normal((16384, K), dtype=np.float32).astype(np.float16))
    q, p = cuquant.quantize_groupwise(x, bits=4, symmetric=False, group_size=128)
    for _ in range(2): cuquant.dequantize_groupwise(q, p, bits=4, symmetric=False, group_size=128, dtype="float16")
cp.cuda.Device().synchronize()
print(which, "done", flush=True)
