"""The checkpoint command on one process against a local Dask cluster of N workers.

    python -m benchmarks.cluster --size 3GB --workers 1,2,4
    python -m benchmarks.cluster --size 8GB --device cuda --workers 1 --format fp8-block

Builds the demo's synthetic Llama-shaped model (bfloat16, `cuquant demo`'s weights) of at
least --size in --work (kept there, and reused by a later run of the same size), then times
``cp -r`` of it, one quantize without a scheduler and one on a LocalCluster of each number
of worker processes (a LocalCUDACluster with --device cuda when dask_cuda is installed),
and compares every output with the single-process one byte for byte. A cluster's start is
timed apart from its run. With --drop-caches the page cache is dropped before each run
(needs root); otherwise the input is read from memory when it fits there, and the figures
measure the compute and the writes. Prints the table and writes cluster.md and cluster.csv
into --out.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import filecmp
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _args():
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster",
                                description=__doc__.split("\n")[0])
    p.add_argument("--size", default="3GB", help="model size in bfloat16 (default 3GB)")
    p.add_argument("--workers", default="1,2,4", help="worker counts (default 1,2,4)")
    p.add_argument("--format", default="W8A8", help="the command's --format (default W8A8)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--stats", action="store_true", help="measure the error too (slower)")
    p.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                  "cuquant-cluster-bench"),
                   help="the model and the outputs (default $TMPDIR/cuquant-cluster-bench)")
    p.add_argument("--out", default=None, help="where cluster.md and cluster.csv go "
                                               "(default: --work)")
    p.add_argument("--drop-caches", action="store_true",
                   help="drop the page cache before each run (needs root)")
    return p.parse_args()


def _drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _same_tree(a: Path, b: Path) -> bool:
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return fa == fb and all(filecmp.cmp(a / f, b / f, shallow=False) for f in fa)


def _model(work: Path, size: str):
    from cuquant.checkpoint import parse_size
    from cuquant.cli.demo import build_model, model_shape

    src = work / f"model-{size}"
    shape = model_shape(parse_size(size))
    if not (src / "config.json").exists():
        shutil.rmtree(src, ignore_errors=True)
        t = time.perf_counter()
        build_model(src, parse_size(size))
        print(f"built {src} in {time.perf_counter() - t:.1f} s", flush=True)
    return src, shape.nbytes()


def _local_cluster(n: int, device: str):
    import logging

    import distributed

    import dask

    kw = dict(n_workers=n, threads_per_worker=1, dashboard_address=":0",
              silence_logs=logging.CRITICAL)
    # As `--scheduler local:N` starts them (cuquant/checkpoint/distributed.py).
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        if device == "cuda":
            try:
                from dask_cuda import LocalCUDACluster

                return LocalCUDACluster(**kw), "LocalCUDACluster"
            except ImportError:
                pass
        return distributed.LocalCluster(processes=True, **kw), "LocalCluster"


def main() -> int:
    args = _args()
    import distributed

    from cuquant import __version__
    from cuquant.checkpoint import human_bytes, quantize_checkpoint

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else work
    out.mkdir(parents=True, exist_ok=True)
    src, nbytes = _model(work, args.size)
    dropped = None
    rows = []

    def timed(label, workers, fn, start=None, identical=None):
        nonlocal dropped
        if args.drop_caches:
            dropped = _drop_caches()
        t = time.perf_counter()
        fn()
        s = time.perf_counter() - t
        rows.append({"run": label, "workers": workers, "seconds": round(s, 2),
                     "GB/s": round(nbytes / s / 1e9, 3), "start_s": start,
                     "identical": identical})
        print(f"{label:>28}: {s:7.2f} s  {nbytes / s / 1e9:6.3f} GB/s", flush=True)

    copy_dst = work / "copy"
    shutil.rmtree(copy_dst, ignore_errors=True)
    timed("cp -r", "-", lambda: subprocess.run(["cp", "-r", str(src), str(copy_dst)],
                                                check=True))
    shutil.rmtree(copy_dst, ignore_errors=True)

    base = work / "single"
    kw = dict(device=args.device, stats=args.stats, overwrite=True)
    timed("one process", 1, lambda: quantize_checkpoint(src, base, args.format, **kw))
    for n in [int(x) for x in args.workers.split(",") if x]:
        t = time.perf_counter()
        cluster, kind = _local_cluster(n, args.device)
        client = distributed.Client(cluster)
        start = round(time.perf_counter() - t, 2)
        dst = work / f"cluster-{n}"
        try:
            timed(f"{kind}, {n} worker{'s' if n > 1 else ''}", n,
                  lambda: quantize_checkpoint(src, dst, args.format, scheduler=client, **kw),
                  start)
        finally:
            client.close()
            cluster.close()
        rows[-1]["identical"] = _same_tree(base, dst)
        shutil.rmtree(dst, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)

    one = next(r["seconds"] for r in rows if r["run"] == "one process")
    for r in rows:
        r["speedup"] = round(one / r["seconds"], 2)
    cols = ["run", "workers", "seconds", "GB/s", "speedup", "start_s", "identical"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("" if r[c] is None else str(r[c]) for c in cols) + " |")
    env = (f"cuquant {__version__}, distributed {distributed.__version__}, Python "
           f"{platform.python_version()}, {os.cpu_count()} CPUs, "
           f"{human_bytes(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))} memory; "
           f"model {human_bytes(nbytes)} bf16, --format {args.format}, device {args.device}, "
           f"stats {'on' if args.stats else 'off'}; page cache "
           + ("dropped before each run" if dropped else "not dropped")
           + "; " + dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    table = "\n".join(lines)
    print(table)
    print(env)
    (out / "cluster.md").write_text(f"# Checkpoint command: one process against a local "
                                    f"Dask cluster\n\n{env}\n\n{table}\n")
    with open(out / "cluster.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r[c] for c in cols})
    print(f"wrote {out / 'cluster.md'} and cluster.csv")
    return 0 if all(r["identical"] in (None, True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
