"""Head against this round's sources: the dequantizers of groups that are not whole 16-byte
units (the general path against dequantize_groups_spanning) and the small-group quantizer
with seeded words four at a time. fp16 16384 x K, x copy counting every input and output."""
import os, pathlib, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from cuquant import groupwise
from benchmarks import harness

here = os.path.dirname(os.path.abspath(__file__))
names = ["head", "new"]


_spanning_expr = groupwise.dequant_spanning_expr
unroll = {}


def spanning_expr(codes, out, g, u):
    return _spanning_expr(codes, out, g, unroll.get("u", u))


groupwise.dequant_spanning_expr = spanning_expr
loaded = [None]


def use(name):
    src, _, u = name.partition("-u")
    if loaded[0] != src:
        harness.use_sources(pathlib.Path(here) / src)
        loaded[0] = src
    harness.forget_plans()
    unroll.clear()
    if u:
        unroll["u"] = int(u)
    groupwise.SPANNING["on"] = src != "head"


timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw / 1e12:.3f} TB/s  {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
rng = np.random.default_rng(0)


def nb(out):
    outs = out if isinstance(out, tuple) else (out,)
    return sum(o.nbytes for o in outs)


def report(label, call, inputs, names=names):
    moved = sum(a.nbytes for a in inputs) + nb(call())
    times, notes = harness.time_variants(names, use, call, timer, rounds=3, reps=15)
    cells = "  ".join(f"{n} " + "/".join(f"{moved / (t * 1e-3) / copy_bw:.3f}" for t in ts)
                      for n, ts in times.items())
    print(f"{label:44s} {cells}  {' '.join(notes)}", flush=True)


def x_of(k, dtype=np.float16):
    return cp.asarray(rng.standard_normal((16384, k), dtype=np.float32).astype(dtype))


which = sys.argv[1] if len(sys.argv) > 1 else "all"
dq_names = names
if which == "unroll":
    dq_names = ["new-u1", "new-u2", "new-u4"]
if which == "split":
    dq_names = ["new", "split"]
if which == "refactor":
    dq_names = ["split", "b2"]
if which in ("all", "dq", "unroll", "split", "refactor"):
    for g, k, bits, sym, out in ((20, 7180, 8, False, "float16"), (20, 7180, 4, False, "float16"),
                                 (6, 7170, 8, True, "float16"), (63, 7182, 4, False, "float16"),
                                 (100, 7200, 8, False, "float16"), (1, 7168, 8, True, "float16"),
                                 (3, 7170, 8, False, "bfloat16"), (6, 7170, 4, False, "float32"),
                                 (128, 7168, 4, False, "float16")):
        x = x_of(k)
        q, p = cuquant.quantize_groupwise(x, bits, sym, g)
        report(f"DeepSpeed dq {bits}-bit {'sym' if sym else 'asym'} G={g} to {out}",
               lambda: cuquant.dequantize_groupwise(q, p, bits, sym, g, out), (q, p), dq_names)
        del x, q, p
    for g, k, bits in ((20, 7180, 4), (20, 7180, 8), (6, 7170, 4)):
        x = x_of(k)
        q, s, z, _ = cuquant.quantize_groupwise_zero_point(x, bits, g)
        report(f"zero point dq {bits}-bit G={g} to float16",
               lambda: cuquant.dequantize_groupwise_zero_point(q, s, z, g, "float16"), (q, s, z),
               dq_names)
        del x, q, s, z
    cp.get_default_memory_pool().free_all_blocks()
if which in ("all", "small"):
    for g, k, bits, kind in ((20, 7180, 8, "seed"), (20, 7180, 4, "seed"), (6, 7170, 8, "seed"),
                             (63, 7182, 4, "seed"), (20, 7180, 4, "rbits"), (20, 7180, 4, "nearest")):
        x = x_of(k)
        kw, inputs = {}, [x]
        if kind == "seed":
            kw = {"rounding": "stochastic", "seed": 12345}
        elif kind == "rbits":
            r = cp.asarray(rng.integers(0, 1 << 32, size=x.shape, dtype=np.uint32))
            kw, inputs = {"rounding": "stochastic", "rbits": r}, [x, r]
        report(f"zero point q {bits}-bit {kind} G={g}",
               lambda: cuquant.quantize_groupwise_zero_point(x, bits, g, **kw), inputs)
        del x, kw, inputs
    for g, k, bits, sym in ((20, 7180, 8, False), (20, 7180, 4, False), (63, 7182, 4, True)):
        x = x_of(k)
        report(f"DeepSpeed q {bits}-bit {'sym' if sym else 'asym'} G={g}",
               lambda: cuquant.quantize_groupwise(x, bits, sym, g), (x,))
        del x
    cp.get_default_memory_pool().free_all_blocks()
