"""Probes of seeded stochastic rounding's ceiling (zero point, tile kernel of its own):
head the committed sources; hash: one multiply and an xor a word in place of Philox
(a probe, not a generator: outputs differ); p7: Philox4x32-7. fp16 16384 x 7168 unless
said, x copy counting x, q, scales, zeros and the reconstruction."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from benchmarks import harness

ab = harness.SourceAB.for_script(__file__, ["head", "hash", "p7"])
report = ab.report
rng = np.random.default_rng(0)

x = cp.asarray(rng.standard_normal((16384, 7168), dtype=np.float32).astype(np.float16))
for bits, g in ((4, 128), (8, 128), (4, 32)):
    report(f"seeded {bits}-bit G={g}",
           lambda: cuquant.quantize_groupwise_zero_point(x, bits, g, rounding="stochastic", seed=7), [x])
report("nearest 4-bit G=128", lambda: cuquant.quantize_groupwise_zero_point(x, 4, 128), [x])
