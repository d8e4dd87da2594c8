"""The warp-shared group-wise dequantizers held to 32 registers a thread (eight blocks of
256 a multiprocessor: __launch_bounds__(256, 8)), and the zero point's 4-bit codes and
parameters prefetched into L2 a wave on. head: the sources at the start of the round;
lb8: head with the bound (DeepSpeed's asymmetric 4-bit kernel, which prefetches, 40 -> 32
registers; every other warp-shared kernel already at 32 or fewer); zc: head with the zero
point's 4-bit codes and first parameters prefetched a wave on (40 registers); zclb8: zc
with the bound (the committed form); zclb8p2: zclb8 with the parameters prefetched two
waves on; zq: zclb8 with the parameters' line prefetched only by the warp whose first
group opens it. With `head,a075,a125,a150`: the committed sources against the prefetch
distance at 3/4, 5/4 and 3/2 of a wave (variants-distance.diff). fp16 output of 16384 x
7168 unless said, x copy counting every input and output; every output compared with
head's bit for bit."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from benchmarks import harness

ab = harness.SourceAB.for_script(__file__, ["head", "lb8", "zc", "zclb8", "zclb8p2", "zq"])
report = ab.report
rng = np.random.default_rng(0)

x = cp.asarray(rng.standard_normal((16384, 7168), dtype=np.float32).astype(np.float16))
for bits, g, dt in ((4, 128, np.float16), (4, 32, np.float16), (4, 128, cp.float32), (4, 128, 'bfloat16'), (8, 128, np.float16)):
    harness.use_sources(None)
    q, s, z, _ = cuquant.quantize_groupwise_zero_point(x, bits, g)
    report(f"zp dequant {bits}-bit G={g} {dt if isinstance(dt, str) else np.dtype(dt).name}",
           lambda: cuquant.dequantize_groupwise_zero_point(q, s, z, g, dt, bits=bits), [q, s, z])
for bits, sym, g in ((4, False, 128), (4, True, 128), (4, False, 2048), (8, False, 128)):
    harness.use_sources(None)
    q, p = cuquant.quantize_groupwise(x, bits, sym, g)
    report(f"ds dequant {bits}-bit {'sym' if sym else 'asym'} G={g}",
           lambda: cuquant.dequantize_groupwise(q, p, bits, sym, g, dtype=np.float16), [q, p])
harness.use_sources(None)
q, p = cuquant.quantize_int4_per_group(x, 128)
report("int4 dequant G=128", lambda: cuquant.dequantize_int4_per_group(q, p, np.float16, 128), [q, p])
harness.use_sources(None)
q, s, z, _ = cuquant.quantize_groupwise_zero_point(x[:1000, :1024], 4, 64)
report("zp dequant 4-bit G=64 1000x1024", lambda: cuquant.dequantize_groupwise_zero_point(q, s, z, 64, np.float16, bits=4), [q, s, z])
