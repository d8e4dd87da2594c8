"""The ``cuquant`` command: quantize, dequantize and inspect safetensors checkpoints, and
a self-contained demo.

Exit codes: 0 success, 1 a problem with the input or output (one line on stderr, no
traceback; ``--debug`` shows it), 2 a usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import textwrap

from .. import __version__
from .console import Notes, ProgressBar, summary, table

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


# ---------------------------------------------------------------------------------------
# Commands

def _progress_for(args, label: str):
    if args.progress is not None:  # asked for, or against, explicitly
        bar = ProgressBar(label) if args.progress else None
    else:
        bar = ProgressBar(label) if sys.stderr.isatty() and not args.quiet else None
    if bar is None and args.scheduler and not args.quiet:
        return Notes()  # the cluster's line (workers, dashboard) still shows
    return bar


def _write_report(path: str | None, report) -> None:
    if path:
        tmp = f"{path}.partial-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)


def _finish(args, report) -> int:
    for w in report.warnings:
        print(f"cuquant: warning: {w}", file=sys.stderr)
    if not args.quiet:
        print(summary(report))
    _write_report(args.report, report)
    return EXIT_OK


def cmd_quantize(args) -> int:
    from ..checkpoint import quantize_checkpoint

    bar = _progress_for(args, "quantize")
    try:
        report = quantize_checkpoint(
            args.input, args.output, args.format, skip=args.skip,
            default_skip=not args.no_default_skip, scale_format=args.scale_format,
            group_size=args.group_size, device=args.device, max_shard_size=args.max_shard_size,
            overwrite=args.overwrite, stats=not args.no_stats, progress=bar,
            scheduler=args.scheduler, resume=args.resume)
    finally:
        if bar is not None:
            bar.close()
    return _finish(args, report)


def cmd_dequantize(args) -> int:
    from ..checkpoint import dequantize_checkpoint

    bar = _progress_for(args, "dequantize")
    try:
        report = dequantize_checkpoint(args.input, args.output, dtype=args.dtype,
                                       device=args.device, max_shard_size=args.max_shard_size,
                                       overwrite=args.overwrite, progress=bar,
                                       scheduler=args.scheduler, resume=args.resume)
    finally:
        if bar is not None:
            bar.close()
    return _finish(args, report)


def cmd_inspect(args) -> int:
    import fnmatch

    from ..checkpoint import human_bytes, inspect_checkpoint

    info = inspect_checkpoint(args.path)
    if args.filter:
        for f in info["files"]:
            f["tensors"] = [t for t in f["tensors"]
                            if any(fnmatch.fnmatchcase(t["name"], p) for p in args.filter)]
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for f in info["files"]:
            meta = " ".join(f"{k}={v}" for k, v in sorted(f["metadata"].items()))
            print(f"{f['path']}  ({human_bytes(f['bytes'])}{'; ' + meta if meta else ''})")
            rows = [[t["name"], t["dtype"], "[" + ", ".join(map(str, t["shape"])) + "]",
                     human_bytes(t["bytes"]), t["role"]]
                    for t in sorted(f["tensors"], key=lambda t: t["name"])]
            if rows:
                print(table(["name", "dtype", "shape", "bytes", "format"], rows, "lllrl"))
            print()
        rows = [[role, t["tensors"], human_bytes(t["bytes"])]
                for role, t in sorted(info["totals"].items())]
        rows.append(["total", sum(t["tensors"] for t in info["totals"].values()),
                     human_bytes(sum(t["bytes"] for t in info["totals"].values()))])
        print(table(["", "tensors", "bytes"], rows))
        qc = info["quantization_config"]
        if qc is not None:
            lists = ("ignored_layers", "modules_to_not_convert", "ignore")
            shown = {k: v for k, v in qc.items() if k not in lists}
            n = max(len(qc.get(k) or []) for k in lists)
            print(f"config.json quantization_config: {json.dumps(shown)}; {n} layers "
                  "left in high precision")
    for p in info["problems"]:
        print(f"cuquant: error: {p}", file=sys.stderr)
    return EXIT_FAIL if info["problems"] else EXIT_OK


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(size=args.size, out=args.out, device=args.device, plot=args.plot,
                    progress=args.progress, overwrite=args.overwrite)


# ---------------------------------------------------------------------------------------
# Arguments

def build_parser() -> argparse.ArgumentParser:
    from ..checkpoint import COMMAND_FORMATS, DEFAULT_SKIP, ENGINE_FORMATS, FORMATS

    about = {name: (ENGINE_FORMATS.get(name) or FORMATS[name]).about for name in COMMAND_FORMATS}
    formats = "\n".join(textwrap.fill(f"{name:<12} {text}", 88, initial_indent="  ",
                                       subsequent_indent=" " * 15, break_on_hyphens=False)
                         for name, text in about.items())
    p = argparse.ArgumentParser(
        prog="cuquant",
        description=textwrap.fill(
            "Quantize model checkpoints (safetensors) with cuquant's kernels: on the GPU "
            "when there is one, else with the NumPy backend (same bits).", 88),
        epilog=f"formats:\n{formats}\n\nStart with `cuquant demo`.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"cuquant {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def common(sp, stats=False):
        sp.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to compute (default: the GPU when there is one)")
        sp.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                        help="cut output shards before this size (default 5GB)")
        sp.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
        sp.add_argument("--report", metavar="FILE", help="write a JSON report here")
        g = sp.add_mutually_exclusive_group()
        g.add_argument("--progress", dest="progress", action="store_true", default=None,
                       help="show progress on stderr (default: when stderr is a terminal)")
        g.add_argument("--no-progress", dest="progress", action="store_false")
        sp.add_argument("-q", "--quiet", action="store_true",
                        help="no summary (and no progress unless --progress)")
        sp.add_argument("--scheduler", metavar="ADDRESS",
                        help="run on a Dask cluster whose workers see the same filesystem: "
                             "its scheduler's address (tcp://host:8786), a scheduler file "
                             "(.json), or local:N for N worker processes here (needs "
                             "cuquant[dask]; the output is the same bytes)")
        sp.add_argument("--resume", action="store_true",
                        help="with --scheduler: continue a run whose client died, redoing "
                             "only the unfinished bands")

    q = sub.add_parser(
        "quantize", help="quantize a checkpoint",
        description=textwrap.fill(
            "Quantize the 2-D weight matrices of a checkpoint; every other tensor, and "
            "weights matching a --skip pattern, stay in high precision. Writes shards, an "
            "index, and the model directory's other files (config.json gains a "
            "quantization_config). Every format is one that inference engines load: the "
            "compressed-tensors schemes (vLLM, SGLang, lmdeploy, transformers with "
            "compressed-tensors), AWQ, and DeepSeek-V3's fp8-block.", 88),
        epilog=textwrap.fill("default --skip patterns (whole names, glob): "
                             + " ".join(DEFAULT_SKIP), 88),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("input", metavar="IN", help="a .safetensors file, a model directory, or an "
                                               "index .json")
    q.add_argument("output", metavar="OUT", help="the output directory")
    q.add_argument("--format", "-f", required=True, choices=list(COMMAND_FORMATS),
                   help="W8A8, FP8_DYNAMIC, W4A16, W4A16_ASYM, W8A16, NVFP4, MXFP4 "
                        "(compressed-tensors), AWQ, or fp8-block (DeepSeek-V3)")
    q.add_argument("--skip", action="append", default=[], metavar="GLOB",
                   help="keep tensors whose whole name matches GLOB in high precision "
                        "(repeatable; adds to the defaults)")
    q.add_argument("--no-default-skip", action="store_true",
                   help="drop the default skip patterns (embeddings, lm_head, norms, routers)")
    q.add_argument("--scale-format", choices=("float32", "ue8m0"), default="float32",
                   help="fp8-block: ue8m0 rounds each tile scale up to a power of two")
    q.add_argument("--group-size", type=int, default=128, metavar="G",
                   help="W4A16, W4A16_ASYM, W8A16, AWQ: elements per group along K "
                        "(default 128)")
    q.add_argument("--no-stats", action="store_true",
                   help="skip measuring the quantization error (faster)")
    common(q)
    q.set_defaults(fn=cmd_quantize)

    d = sub.add_parser("dequantize", help="restore a float checkpoint",
                       description="Dequantize every quantized weight (compressed-tensors, "
                                   "AWQ, DeepSeek-V3-style FP8, or cuquant's own formats) and "
                                   "drop the quantization_config from config.json.")
    d.add_argument("input", metavar="IN")
    d.add_argument("output", metavar="OUT")
    d.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                   help="restored type (default: the type recorded at quantization)")
    common(d)
    d.set_defaults(fn=cmd_dequantize)

    i = sub.add_parser("inspect", help="list a checkpoint's tensors",
                       description="Print each tensor's dtype, shape, bytes and format.")
    i.add_argument("path", metavar="FILE", help="a .safetensors file, a directory, or an index")
    i.add_argument("--filter", action="append", metavar="GLOB", help="only names matching GLOB")
    i.add_argument("--json", action="store_true", help="print JSON instead of tables")
    i.set_defaults(fn=cmd_inspect)

    m = sub.add_parser("demo", help="quantize a synthetic model in every format",
                       description="Build a small synthetic model locally (no download), "
                                   "quantize it in every format, print the error and size of "
                                   "each, and draw them (needs matplotlib: cuquant[plot]).")
    m.add_argument("--size", default="200MB", help="model size in bf16 (default 200MB)")
    m.add_argument("--out", metavar="DIR", help="keep the checkpoints here (default: a "
                                               "temporary directory, removed)")
    m.add_argument("--plot", default="cuquant-demo.png", metavar="PNG",
                   help="chart file (default cuquant-demo.png; 'none' for no chart)")
    m.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    m.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    g = m.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None)
    g.add_argument("--no-progress", dest="progress", action="store_false")
    m.set_defaults(fn=cmd_demo)
    return p


def _os_message(e: OSError, args) -> str:
    what = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1), errno.EFBIG):
        where = getattr(args, "output", None) or getattr(args, "out", None)
        return f"{what} while writing {where or 'the output'}; nothing was left under its name"
    return f"{e.filename}: {what}" if e.filename else what


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from ..checkpoint.safetensors import SafetensorsError
    from ..checkpoint import CheckpointError

    old = None
    try:
        old = signal.signal(signal.SIGTERM, _terminate)  # clean up the partial output too
    except ValueError:  # not the main thread
        pass
    try:
        return args.fn(args)
    except (CheckpointError, SafetensorsError) as e:
        if args.debug:
            raise
        print(f"cuquant: error: {e}", file=sys.stderr)
        return EXIT_FAIL
    except OSError as e:
        if args.debug:
            raise
        print(f"cuquant: error: {_os_message(e, args)}", file=sys.stderr)
        return EXIT_FAIL
    except MemoryError:
        if args.debug:
            raise
        print("cuquant: error: out of memory", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("\ncuquant: interrupted; the partial output was removed", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main())
