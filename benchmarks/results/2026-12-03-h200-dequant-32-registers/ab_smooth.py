"""SmoothQuant's fixed cost a call: each block builds its tables (RN(1 / smooth), -smooth)
before its first row. head: the committed sources (the first row's copy issued first, the
tables' loads in rounds of four a thread); t8: the tables' loads in one round of up to
eight a thread (K <= 8192 at 256 threads); t8f: t8 with the first row's copy issued just
after the tables' loads; dyn (a probe, run as `ab_smooth.py head,dyn`): teams of several
warps take their rows after the first two from a counter in a module global (one launch at
a time only), reset by the last team out. x copy counting x, smooth, q and scale; every
output compared with head's bit for bit."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from benchmarks import harness

ab = harness.SourceAB.for_script(__file__, ["head", "t8", "t8f"])
rng = np.random.default_rng(0)


def case(label, rows, k, dtype="bfloat16", special=False):
    x, smooth = harness.smooth_input(cp, rng, rows, k, dtype, special)
    ab.report(label, lambda: cuquant.smooth_quant(x, smooth), [x, smooth])


case("bf16 16384 x 7168", 16384, 7168)
case("bf16 16384 x 7168 special rows", 16384, 7168, special=True)
case("fp16 16384 x 7168", 16384, 7168, "float16")
case("bf16 8192 x 7168", 8192, 7168)
case("bf16 4096 x 7168", 4096, 7168)
case("bf16 16384 x 4096", 16384, 4096)
case("bf16 4096 x 14336", 4096, 14336)
case("bf16 16384 x 7160 (not full)", 16384, 7160)
