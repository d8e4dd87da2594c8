"""SmoothQuant: rows from a counter, rows prefetched into L2, and teams sharing one block's
tables. Variants (folders beside this script, copies of cuda_src with `variants.diff`):
head: the counter off, blocks of 256 (the kernel as before, with the workspace argument);
dyn: the counter (teams of several warps, 5-7 vectors a thread, full rows); dyne: the
counter's row taken a row earlier (its latency hidden by a row); dynp: dyn with the row
after next prefetched into L2 once the counter hands it out; headp: head with the row two
strides ahead prefetched into L2; w512: dyn with teams of 128 at 5-7 vectors four to a
block of 512; w768: w512 and blocks of 768 at 4 vectors; final_as_run: every team of 5-7
vectors in blocks of 512 (printed as `final` when it ran); final: the library's sources.
x copy counting x, smooth, q and scale; every output compared with the first variant's bit
for bit. AB_WIDE=1 and AB_MORE=1 add cases."""
import os, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from benchmarks import harness

ab = harness.SourceAB.for_script(__file__, ["head", "dyn", "dyne", "dynp", "headp"])
rng = np.random.default_rng(0)

# The launch's threads follow the folder's SmoothShape: head, dyn, dyne, dynp and headp as
# before this round (two blocks of 256 for teams of 128), the others as their folders say.
from cuquant import _symmetric
_threads, _use, _geom, _last = _symmetric.smooth_threads, ab.use, _symmetric.smooth_geometry, {}


def geometry(nvec, wide=True):
    _last["g"] = _geom(nvec, wide)
    return _last["g"]


def old(tpg, vpt):
    return 512 if tpg == 256 else max(tpg, 256)


RULES = {"w512": lambda tpg, vpt: 512 if tpg == 128 and vpt > 4 else old(tpg, vpt),
         "w768": lambda tpg, vpt: tpg if tpg >= 512 else 512 if vpt > 4 else 768,
         "final_as_run": lambda tpg, vpt: tpg if tpg >= 512 else 512 if tpg == 256 or vpt > 4 else 256,
         "final": _threads}
_symmetric.smooth_geometry = geometry


def use(name):
    rule = RULES.get(name, old)
    _symmetric.smooth_threads = lambda *a: rule(*_last["g"])
    _use(name)


ab.use = use


def case(label, rows, k, dtype="bfloat16", special=False):
    x, smooth = harness.smooth_input(cp, rng, rows, k, dtype, special)
    ab.report(label, lambda: cuquant.smooth_quant(x, smooth), [x, smooth])


CASES = [(16384, 7168), (16384, 7168, "bfloat16", True), (16384, 7168, "float16"), (8192, 7168),
         (32768, 7168), (16384, 7168), (4096, 7168), (16384, 4096), (16384, 7160)]
WIDE = [(16384, 3584), (32768, 1792), (16384, 3584, "float16"), (16384, 3584, "float32")]
MORE = [(2048, 4096), (8192, 4096), (4096, 14336), (16384, 7168, "float32"), (16384, 3584)]
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
for rows, k, *rest in (CASES + (WIDE if os.environ.get("AB_WIDE") else [])
                       + (MORE if os.environ.get("AB_MORE") else [])):
    dtype, special = (rest + ["bfloat16", False][len(rest):])[:2]
    case(f"{SHORT[dtype]} {rows} x {k}" + (" special rows" if special else ""), rows, k, dtype, special)
