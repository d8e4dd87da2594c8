"""Head against the warp-shared dequantizers with an L2 prefetch, by one lane each, of the
codes and first parameters of the warp a wave (pf1: 8448 warps, 132 x 64), two waves (pf2)
or half a wave (pfh) on; new: the committed form (DeepSpeed's 4-bit codes only), zc: new
with the zero point's 4-bit codes too. fp16 output of 16384 x 7168 unless said, x copy counting every
input and output; every output compared with head's bit for bit."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from benchmarks import harness

ab = harness.SourceAB.for_script(__file__, ["head", "pf1", "new", "zc"])
report = ab.report
rng = np.random.default_rng(0)

x = cp.asarray(rng.standard_normal((16384, 7168), dtype=np.float32).astype(np.float16))
for bits, sym, g in ((4, False, 128), (4, True, 128), (4, False, 2048), (8, False, 128)):
    harness.use_sources(None)
    q, p = cuquant.quantize_groupwise(x, bits, sym, g)
    report(f"ds dequant {bits}-bit {'sym' if sym else 'asym'} G={g}",
           lambda: cuquant.dequantize_groupwise(q, p, bits, sym, g, dtype=np.float16), [q, p])
harness.use_sources(None)
q, p = cuquant.quantize_int4_per_group(x, 128)
report("int4 dequant G=128", lambda: cuquant.dequantize_int4_per_group(q, p, np.float16, 128), [q, p])
for bits in (4, 8):
    harness.use_sources(None)
    q, s, z, _ = cuquant.quantize_groupwise_zero_point(x, bits, 128)
    report(f"zp dequant {bits}-bit G=128",
           lambda: cuquant.dequantize_groupwise_zero_point(q, s, z, 128, np.float16, bits=bits), [q, s, z])
harness.use_sources(None)
xs = cp.asarray(rng.standard_normal((16384, 7072), dtype=np.float32).astype(np.float16))
q, p = cuquant.quantize_groupwise(xs, 4, False, 136)
report("ds dequant 4-bit asym G=136 K=7072",
       lambda: cuquant.dequantize_groupwise(q, p, 4, False, 136, dtype=np.float16), [q, p])
q, p = cuquant.quantize_groupwise(x[:1000, :1000], 4, False, 40)
report("ds dequant 4-bit G=40 1000x1000 (tail)",
       lambda: cuquant.dequantize_groupwise(q, p, 4, False, 40, dtype=np.float16), [q, p])
