"""The zero point's 4-bit dequantizer with the L2 prefetch: zc as in ab_r24.py, zcc the
codes alone a wave on, zch codes and parameters half a wave on, zcc2 the codes alone two
waves on. Head against the warp-shared dequantizers with an L2 prefetch, by one lane each, of the
codes and first parameters of the warp a wave (pf1: 8448 warps, 132 x 64), two waves (pf2)
or half a wave (pfh) on; new: the committed form (DeepSpeed's 4-bit codes only), zc: new
with the zero point's 4-bit codes too. fp16 output of 16384 x 7168 unless said, x copy counting every
input and output; every output compared with head's bit for bit."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from benchmarks import harness

ab = harness.SourceAB.for_script(__file__, ["head", "new", "zc", "zcc", "zch", "zcc2"])
report = ab.report
rng = np.random.default_rng(0)

x = cp.asarray(rng.standard_normal((16384, 7168), dtype=np.float32).astype(np.float16))
for g in (128, 32):
    harness.use_sources(None)
    q, s, z, _ = cuquant.quantize_groupwise_zero_point(x, 4, g)
    report(f"zp dequant 4-bit G={g}",
           lambda: cuquant.dequantize_groupwise_zero_point(q, s, z, g, np.float16, bits=4), [q, s, z])
harness.use_sources(None)
q, p = cuquant.quantize_groupwise(x, 4, False, 128)
report("ds dequant 4-bit asym G=128", lambda: cuquant.dequantize_groupwise(q, p, 4, False, 128, dtype=np.float16), [q, p])
