"""The batched dequantizer's kernel alone, head against variants with spanning paths:
64 tensors of 1-4 MB of codes (groupwise.batched_inputs) to fp16 or float32, and a batch
of group sizes that are not whole units. x copy counting codes, parameters and outputs.
Also the single dequantizer's spanning kernel (head's against the refactored one)."""
import os, pathlib, sys
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp
import cuquant
from cuquant import groupwise as gw
from benchmarks import harness

here = pathlib.Path(os.path.dirname(os.path.abspath(__file__)))
names = sys.argv[1].split(",")   # the first is head: its sources have no batched spanning paths
timer = harness.Timer()
copy_bw = harness.copy_bandwidth(timer)
print(f"copy {copy_bw / 1e12:.3f} TB/s  {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
rng = np.random.default_rng(0)


def use(name):
    harness.use_sources(here / name)
    gw.SPANNING["on"] = name != names[0] or "single" in sys.argv


def kernel_of(items, out):
    """(launch, outputs) of the batch's kernel: the call made once, its table kept."""
    got = {}
    real = gw.BatchRun.__call__

    def spy(self, stream, ptrs):
        res = real(self, stream, ptrs)
        got.update(run=self, ptrs=ptrs, res=res)
        return res

    gw.BatchRun.__call__ = spy
    try:
        cuquant.dequantize_groupwise_batched(items, out)
    finally:
        gw.BatchRun.__call__ = real
    run, res = got["run"], got["res"]
    table = list(run.rows)
    for (shape, typ, nbytes, row), (qp, pp), r in zip(run.outputs, got["ptrs"], res):
        if row >= 0:
            table[row] = (qp, pp, r.data.ptr) + table[row][3:]
    t = cp.asarray(np.array(table, dtype=np.uint64).view(np.int64))
    s = cp.cuda.get_current_stream()
    return (lambda: run.launch(run.blocks, 256, s, (t.data.ptr, len(table)))), res, t


def batch(label, items, out):
    moved = sum(q.nbytes + p.nbytes for q, p, *_ in items)
    times = {n: [] for n in names}
    want, notes = None, set()
    for _ in range(3):
        for name in names:
            use(name)
            launch, res, t = kernel_of(items, out)
            words = [r.view(f"u{r.dtype.itemsize}") for r in res]
            if want is None:
                want = [w.copy() for w in words]
            elif any(not bool((a == b).all()) for a, b in zip(words, want)):
                notes.add(f"DIFF {name}")
            times[name].append(timer.time_ms(launch, reps=15))
            if _ == 0 and name == names[0]:
                moved_out = sum(r.nbytes for r in res)
    total = moved + moved_out
    cells = "  ".join(f"{n} " + "/".join(f"{total / (ms * 1e-3) / copy_bw:.3f}" for ms in ts)
                      for n, ts in times.items())
    print(f"{label:40s} {cells}  {' '.join(sorted(notes))}", flush=True)


def odd_groups(count, max_elems, groups):
    items = []
    for i in range(count):
        g = groups[i % len(groups)]
        n = int(rng.integers(max_elems // 4, max_elems + 1)) // (2 * g) * 2 * g
        bits, sym = (4, 8)[i % 2], bool((i // 2) % 2)
        x = cp.asarray(rng.standard_normal(n, dtype=np.float32))
        q, p = cuquant.quantize_groupwise(x, bits, sym, g)
        items.append((q, p, bits, sym, g))
    return items


if "single" not in sys.argv:
    for mixed in (False, True):
        items = gw.batched_inputs(cp, rng, 64, 4 << 20, mixed=mixed)
        for out in ("float16", "float32"):
            batch(f"batched 64 mixed={mixed} to {out}", items, out)
        del items
    items = odd_groups(64, 4 << 20, (20, 6, 100, 3))
    for out in ("float16", "float32"):
        batch(f"batched 64 G=20,6,100,3 to {out}", items, out)
    del items
    cp.get_default_memory_pool().free_all_blocks()
