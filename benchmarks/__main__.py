"""The benchmark: every declared op at the benchmark's shapes, beside the copy bandwidth
and the torch eager / torch.compile / naive CuPy baselines (method: docs/performance.md).

    python -m benchmarks                       # everything, torch.compile included
    python -m benchmarks --quick               # headline shape and small shapes only
    python -m benchmarks --ops quantize_int8_per_channel --no-compile

Writes benchmark.md (table and environment), benchmark.csv and benchmark.png into
<out>/<gpu>/ (e.g. benchmarks/results/h200/), replacing the previous run on that GPU, and
prints the table. A run limited by --ops, --family or --dtype writes into <gpu>-partial/
unless --tag names the folder's suffix, so that it never replaces a whole run.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import re
import sys
import traceback

import numpy as np

import op_table

from . import harness

DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "results")


def _args():
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    p.add_argument("--family", default="", help="comma-separated families (int8, fp8, ...)")
    p.add_argument("--dtype", default="", help="input dtype (default: each op's bench dtype)")
    p.add_argument("--quick", action="store_true", help="headline and small shapes only")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-baselines", action="store_true", help="skip every baseline")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--host-passes", type=int, default=5,
                   help="passes over the small calls' host time, 5 s apart (default 5)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help="results folder; each GPU writes into its own folder under it")
    p.add_argument("--tag", default=None,
                   help="suffix of the GPU's folder (default: none, or 'partial' for a "
                        "run limited by --ops, --family or --dtype)")
    return p.parse_args()


def environment() -> dict:
    import cupy as cp

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    env = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "sm_count": dev.attributes["MultiProcessorCount"],
        "l2_bytes": dev.attributes["L2CacheSize"],
        "driver": cp.cuda.runtime.driverGetVersion(),
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cupy": cp.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:
        env["torch"] = None
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # CuPy shares the GPU
    try:
        import jax

        env["jax"] = jax.__version__ if jax.devices("gpu") else None
    except Exception:  # noqa: BLE001 - no JAX, or no GPU for it
        env["jax"] = None
    return env


def _bench_dtype(op, forced: str) -> str:
    if forced:
        return forced
    return getattr(op, "bench_dtype", None) or ("bfloat16" if "bfloat16" in op.dtypes else op.dtypes[0])


def _shapes(op, quick):
    """The op's benchmark shapes; --quick keeps the small ones and the headline, or all of
    an op's own when it has none of those (the batched op's tensor lists)."""
    shapes = getattr(op, "bench_shapes", op_table.BENCH_SHAPES)
    if quick:
        kept = [s for s in shapes if s in op_table.SMALL_SHAPES or s == op_table.HEADLINE]
        shapes = kept or shapes
    return shapes


def _baseline(kind, op, args, kwargs, timer, reps, compiled_cache):
    """Median ms of a baseline, or None when the op declares none."""
    import torch

    if kind == "cupy":
        if op.cupy_ref is None:
            return None
        fn = op.cupy_ref
        return timer.time_ms(lambda: fn(*args, **kwargs), reps=reps)
    if op.torch_ref is None:
        return None
    targs = harness.to_torch(list(args))
    if op.family == "fp8" and op.kind == "dequantize" and targs[0].dtype == torch.uint8:
        targs[0] = targs[0].view(torch.float8_e4m3fn)  # CuPy's fp8 codes, as torch's dtype
    if kind == "eager":
        fn = op.torch_ref
    else:
        key = (op.name, op.notes)
        fn = compiled_cache.get(key)
        if fn is None:
            fn = torch.compile(op.torch_ref, dynamic=False)
            compiled_cache[key] = fn
    with torch.no_grad():
        return timer.time_ms(lambda: fn(*targs, **kwargs), reps=reps)


def run(opts, checkpoint=None) -> list[dict]:
    import cupy as cp

    env = environment()
    timer = harness.Timer()
    copy_bw = harness.copy_bandwidth(timer)
    print(f"# {env['gpu']}  copy bandwidth {copy_bw / 1e12:.3f} TB/s  ({env['date']})", flush=True)
    ops = op_table.all_ops()
    if opts.ops:
        ops = [o for o in ops if o.name in opts.ops.split(",")]
    if opts.family:
        ops = [o for o in ops if o.family in opts.family.split(",")]
    have_torch = env["torch"] is not None and not opts.no_baselines
    compiled: dict = {}
    rows = []
    rng = np.random.default_rng(0)
    host = harness.HostTimes()
    for op in ops:
        dtype = _bench_dtype(op, opts.dtype)
        for variant in op.bench_variants:
            for shape in _shapes(op, opts.quick):
                row = {"op": op.name + (f" ({op.notes})" if op.notes else ""),
                       "variant": json.dumps(variant) if variant else "", "dtype": dtype,
                       "shape": "x".join(map(str, shape)), "target": op.target}
                try:
                    args, kwargs = op.make(cp, rng, shape, dtype, **variant)
                    call = lambda: op.fn(*args, **kwargs)  # noqa: E731
                    out = call()
                    moved, logical = harness.bytes_moved(op, args, kwargs, out)
                    ms = timer.time_ms(call, reps=opts.reps)
                    row.update(us=ms * 1e3, bytes=moved, logical_bytes=logical,
                               tbps=moved / (ms * 1e-3) / 1e12,
                               frac_copy=moved / (ms * 1e-3) / copy_bw)
                    if shape in op_table.SMALL_SHAPES:
                        host.add(len(rows), call)
                        row.update(host.result(len(rows)))
                    if shape in op_table.SMALL_SHAPES[:2] or shape == op_table.HEADLINE:
                        _families(op, args, kwargs, shape, host, rows, row, env)
                    if op.alternative is not None:
                        alt = op.alternative(args, kwargs)
                        row["alternative"] = op.alternative_name
                        row["alternative_us"] = timer.time_ms(alt, reps=opts.reps) * 1e3
                        row["wall_us"] = harness.wall_us(call)
                        row["alternative_wall_us"] = harness.wall_us(alt)
                    if have_torch:
                        for kind in ("eager", "compile", "cupy"):
                            if kind == "compile" and (opts.no_compile or shape != op_table.HEADLINE):
                                continue
                            try:
                                bms = _baseline(kind, op, args, kwargs, timer, opts.reps, compiled)
                            except Exception as e:  # noqa: BLE001 - a baseline may not apply
                                print(f"  {kind} baseline: {type(e).__name__}: {e}"[:200])
                                bms = None
                            if bms is not None:
                                row[f"{kind}_frac"] = logical / (bms * 1e-3) / copy_bw

                except Exception as e:  # noqa: BLE001 - report and go on with the next
                    row["error"] = f"{type(e).__name__}: {e}"
                    traceback.print_exc()
                rows.append(row)
                print(_line(row), flush=True)
                if checkpoint is not None:  # partial results survive an interrupted run
                    checkpoint(env, copy_bw, rows)
                cp.get_default_memory_pool().free_all_blocks()
    if host.calls and opts.host_passes > 1:
        print(f"# host time: {opts.host_passes - 1} more passes over {len(host.calls)} calls",
              flush=True)
        host.passes(opts.host_passes - 1)
        for i in host.calls:
            if isinstance(i, tuple):  # another family's call of row i[0]
                _family_result(rows[i[0]], i[1], host.result(i))
            else:
                rows[i].update(host.result(i))
    return env, copy_bw, rows


def _families(op, args, kwargs, shape, host, rows, row, env):
    """The same call with torch tensors (directly and through its torch custom op) and with
    JAX arrays: host times at the small shapes; at the headline shape, 100 back-to-back
    calls with CuPy arrays and with torch tensors."""
    fp8 = op.family == "fp8" and op.kind == "dequantize"
    headline = shape == op_table.HEADLINE
    calls = {}
    if env.get("torch"):
        import torch

        from cuquant._core import torch_ops

        targs = harness.arrays_as(list(args), lambda a: harness.cupy_to_torch(a, fp8))
        tkw = harness.arrays_as(kwargs, harness.cupy_to_torch)
        calls["torch"] = lambda: op.fn(*targs, **tkw)  # noqa: E731
    if env.get("torch") and not headline:
        torch_ops.register()
        tensors: list = []
        spec = torch_ops._encode(torch_ops._split(tuple(targs), tensors),
                                 torch_ops._split(tkw, tensors))
        custom = getattr(torch.ops.cuquant, op.name)
        calls["customop"] = lambda: custom(tensors, spec)  # noqa: E731
    if env.get("jax") and not headline:
        jargs = harness.arrays_as(list(args), lambda a: harness.cupy_to_jax(a, fp8))
        jkw = harness.arrays_as(kwargs, harness.cupy_to_jax)
        calls["jax"] = lambda: op.fn(*jargs, **jkw)  # noqa: E731
    for name, fn in calls.items():
        try:
            fn()
            if headline:
                if name == "torch":
                    row["b2b_us"], row["b2b_torch_us"] = harness.back_to_back_us(
                        lambda: op.fn(*args, **kwargs), fn)
            else:
                key = (len(rows), name)
                if name == "customop":
                    host.add(key, fn)
                else:  # beside the call on CuPy arrays, on one CPU
                    host.add_beside(key, fn, lambda: op.fn(*args, **kwargs))
                _family_result(row, name, host.result(key))
        except Exception as e:  # noqa: BLE001 - a family may not take the op
            print(f"  {name} call: {type(e).__name__}: {e}"[:200])


def _family_result(row, name, result) -> None:
    row[f"host_{name}_us"] = result["host_us"]
    if "over_us" in result:
        row[f"host_{name}_over_us"] = result["over_us"]


COLUMNS = [("op", "op"), ("variant", "variant"), ("dtype", "dtype"), ("shape", "shape"),
           ("us", "time us"), ("tbps", "TB/s"), ("frac_copy", "x copy"), ("target", "target"),
           ("host_us", "host us"), ("launch_us", "empty launch us"), ("host_cpu", "CPU"),
           ("host_median_us", "host us, median pass"),
           ("launch_median_us", "empty launch us, median"),
           ("host_torch_us", "host us, torch in"),
           ("host_torch_over_us", "torch in over CuPy, us"),
           ("host_customop_us", "host us, torch custom op"),
           ("host_jax_us", "host us, JAX in"), ("host_jax_over_us", "JAX in over CuPy, us"),
           ("b2b_us", "100 back to back, us a call"), ("b2b_torch_us", "the same, torch in"),
           ("eager_frac", "torch eager"),
           ("compile_frac", "torch.compile"), ("cupy_frac", "naive CuPy"),
           ("alternative", "compared with"), ("alternative_us", "its time us"),
           ("wall_us", "wall us"), ("alternative_wall_us", "its wall us"), ("error", "error")]


def _fmt(key, v):
    if v is None or v == "":
        return ""
    if key in ("frac_copy", "eager_frac", "compile_frac", "cupy_frac", "target"):
        return f"{v:.3f}"
    if key in ("us", "host_us", "launch_us", "host_median_us", "launch_median_us",
               "alternative_us", "wall_us", "alternative_wall_us", "host_torch_us",
               "host_customop_us", "host_jax_us", "b2b_us", "b2b_torch_us",
               "host_torch_over_us", "host_jax_over_us"):
        return f"{v:.1f}"
    if key == "tbps":
        return f"{v:.3f}"
    return str(v)


def _line(row) -> str:
    return "| " + " | ".join(_fmt(k, row.get(k)) for k, _ in COLUMNS) + " |"


def markdown(env, copy_bw, rows) -> str:
    head = [f"# cuquant benchmark, {env['gpu']}, {env['date']}", "",
            "```", json.dumps(env, indent=1), "```", "",
            f"Copy bandwidth (device to device, read + write): **{copy_bw / 1e12:.3f} TB/s**.",
            "Time is the median over cold-L2 runs; `x copy` is effective bandwidth over the copy "
            "bandwidth (bytes really moved; per-tensor dynamic counts its two reads); baselines "
            "are the same fraction for the torch eager expression, the same under torch.compile "
            "(headline shape only) and the naive CuPy expression, each counted at the logical "
            "bytes. `host us` is the host time of one call (wall clock inside the call with "
            "the GPU idle, median of 1000 calls) in the lowest of several passes spread "
            "over the run, each pass pinned to the CPU where an empty CuPy kernel launch "
            "was quickest at the time; `empty launch us` and `CPU` are that pass's empty "
            "launch, measured the same way right after the call's, and its CPU; "
            "`host us, median pass` and `empty launch us, median` are the medians over the passes, which other processes' load on the machine "
            "can slow. `host us, torch in`, `host us, torch custom op` and `host us, JAX in` "
            "are the same call's host time (lowest pass) with torch tensors, through "
            "`torch.ops.cuquant.<op>` and with JAX arrays; `torch in over CuPy` and `JAX in "
            "over CuPy` are the difference from the call on CuPy arrays measured beside it "
            "(alternating on one CPU in each pass, the lowest of three rounds each), the "
            "median over the passes. At the headline shape, "
            "`100 back to back` is a call's share of 100 calls made back to back without an "
            "L2 flush and with one synchronization at the end, with CuPy arrays and with "
            "torch tensors (the median of 12 rounds, the two taking turns in an order reversed "
            "every other round).", "",
            "| " + " | ".join(name for _, name in COLUMNS) + " |",
            "|" + "---|" * len(COLUMNS)]
    return "\n".join(head + [_line(r) for r in rows]) + "\n"


def _plot_label(row) -> str:
    """A short legend label: the op, its notes up to the first ';', and its variant."""
    label = row["op"].split(";")[0]
    if label.count("(") > label.count(")"):
        label += ")"
    if row.get("variant"):
        variant = json.loads(row["variant"])
        label += " " + ",".join(f"{k}={v}" for k, v in variant.items())
    return label


def plot(rows, copy_bw, path):
    """Effective bandwidth against bytes moved, one line per op and variant, beside the
    copy bandwidth."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    lines: dict = {}
    for r in rows:
        if "tbps" in r:
            lines.setdefault(_plot_label(r), []).append((r["bytes"], r["tbps"]))
    fig, ax = plt.subplots(figsize=(11, 8))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, pts) in enumerate(sorted(lines.items())):
        pts.sort()
        ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                linewidth=1, color=cycle[i % len(cycle)],
                linestyle=("-", "--", ":")[i // len(cycle) % 3], label=label)
    ax.axhline(copy_bw / 1e12, color="black", linestyle="--", linewidth=1.5,
               label="device copy")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per call (MB)")
    ax.set_ylabel("effective bandwidth (TB/s)")
    ax.set_title("cuquant kernels: effective bandwidth against size")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return True


def write(base: str, env, copy_bw, rows, with_plot: bool = True) -> str:
    md = markdown(env, copy_bw, rows)
    with open(base + ".md", "w") as f:
        f.write(md)
    with open(base + ".csv", "w", newline="") as f:
        keys = [k for k, _ in COLUMNS if any(k in r for r in rows)]
        keys += sorted({k for r in rows for k in r} - set(keys))
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    # A plot left from the previous run would not match the table beside it.
    if not (with_plot and plot(rows, copy_bw, base + ".png")) and os.path.exists(base + ".png"):
        os.remove(base + ".png")
    return md


def gpu_slug(name: str) -> str:
    """A GPU's folder name: 'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' ->
    'h100-80gb-hbm3'."""
    words = re.sub(r"[^a-z0-9]+", " ", name.lower()).split()
    words = [w for w in words if w not in ("nvidia", "geforce", "tesla")]
    return "-".join(words) or "gpu"


def results_folder(out: str, gpu: str, tag: str | None = None) -> str:
    """The folder a run on `gpu` writes into: one per GPU (and tag) under `out`."""
    return os.path.join(out, gpu_slug(gpu) + (f"-{tag}" if tag else ""))


def main():
    opts = _args()
    tag = opts.tag
    if tag is None and (opts.ops or opts.family or opts.dtype):
        tag = "partial"

    def base_of(env):
        folder = results_folder(opts.out, env["gpu"], tag)
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, "benchmark")

    env, copy_bw, rows = run(opts, lambda e, c, r: write(base_of(e), e, c, r, with_plot=False))
    print(write(base_of(env), env, copy_bw, rows))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
