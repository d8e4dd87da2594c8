"""Dequantizers on the general path (groups that are not whole 16-byte units of output),
16384 x 7180 codes, x copy counting the codes, the parameters and the output."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from benchmarks import harness
timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw/1e12:.3f} TB/s", flush=True)
rng = np.random.default_rng(0)
for g, cols in ((20, 7180), (128, 7168), (6, 7176), (63, 7182)):
    x = cp.asarray(rng.standard_normal((16384, cols), dtype=np.float32).astype(np.float16))
    for bits in (8, 4):
        q, p = cuquant.quantize_groupwise(x, bits, False, g)
        call = lambda: cuquant.dequantize_groupwise(q, p, bits, False, g, "float16")
        moved = q.nbytes + p.nbytes + call().nbytes
        ms = timer.time_ms(call, reps=15)
        print(f"DeepSpeed {bits}-bit G={g} dequantize: {ms*1e3:.1f} us ({moved / (ms * 1e-3) / copy_bw:.3f})", flush=True)
    if cols % g == 0:
        q, s, z, _ = cuquant.quantize_groupwise_zero_point(x, 4, g)
        call = lambda: cuquant.dequantize_groupwise_zero_point(q, s, z, g, "float16")
        moved = q.nbytes + s.nbytes + z.nbytes + call().nbytes
        ms = timer.time_ms(call, reps=15)
        print(f"zero point 4-bit G={g} dequantize: {ms*1e3:.1f} us ({moved / (ms * 1e-3) / copy_bw:.3f})", flush=True)
    del x
    cp.get_default_memory_pool().free_all_blocks()
