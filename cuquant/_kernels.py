"""The kernel loader.

The CUDA sources live in the top-level `cuda_src/` of the repository; the wheel carries
them as `cuquant/cuda_src/`. Both are found through importlib.resources, nothing is ever
written into the package. A source's `#include "..."` lines are inlined here, so the text
handed to NVRTC (and hashed by CuPy's disk cache) covers every header it uses.

Each specialization (one C++ name expression) becomes its own RawModule, compiled on first
use for the device it runs on and memoized per device; CuPy's disk cache keeps the binary
across processes. Importing cuquant needs neither CuPy nor NVRTC.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import pathlib
import re
import threading

from ._arrays import require_cupy

#: NVRTC options of every module (CuPy adds -ftz=true and the architecture itself).
OPTIONS = ("-std=c++17",)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def source_dir():
    """The folder of CUDA sources, as an importlib.resources Traversable."""
    package = importlib.resources.files("cuquant")
    bundled = package.joinpath("cuda_src")
    if bundled.is_dir():  # installed wheel
        return bundled
    if isinstance(package, pathlib.Path):  # checkout (editable install or PYTHONPATH)
        checkout = package.parent / "cuda_src"
        if checkout.is_dir():
            return checkout
    raise RuntimeError(
        "cuquant: the CUDA sources (cuda_src) are missing from this installation; "
        "reinstall cuquant from its wheel or run from a full checkout"
    )


@functools.lru_cache(maxsize=None)
def source(name: str) -> str:
    """The text of cuda_src/<name> with its quoted includes inlined (each header once)."""
    folder = source_dir()
    seen: set[str] = set()

    def expand(fname: str) -> str:
        out = []
        for line in folder.joinpath(fname).read_text(encoding="utf-8").splitlines():
            m = _INCLUDE.match(line)
            if m:
                inc = m.group(1)
                if inc not in seen:
                    seen.add(inc)
                    out.append(expand(inc))
            elif line.strip() != "#pragma once":
                out.append(line)
        return "\n".join(out)

    return expand(name) + "\n"


_lock = threading.Lock()
_functions: dict = {}


def function(src: str, name_expression: str, device: int):
    """The compiled kernel for one specialization on one device (memoized, thread-safe)."""
    key = (src, name_expression, device)
    fn = _functions.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _functions.get(key)
        if fn is None:
            cp = require_cupy(name_expression)
            with cp.cuda.Device(device):
                module = cp.RawModule(code=source(src), options=OPTIONS,
                                      name_expressions=(name_expression,))
                fn = module.get_function(name_expression)
            _functions[key] = fn
    return fn


# ---------------------------------------------------------------------------------------
# Every specialization, for the compile check (NVRTC alone, no GPU).

def all_specializations() -> dict[str, list[str]]:
    """Every name expression the library can launch, by source file."""
    from . import _symmetric, groupwise, zero_point

    table: dict[str, list[str]] = {}
    for family in (_symmetric, groupwise, zero_point):
        for src, expr in family.specializations():
            table.setdefault(src, []).append(expr)
    return table


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """The options CuPy's RawModule compiles OPTIONS with, for `arch` (e.g. "sm_90")."""
    return OPTIONS + ("-ftz=true", f"-arch={arch}", "--device-as-default-execution-space")


def _compiled(src: str, part: list[str], arch: str):
    """An NVRTC program of `part`'s name expressions in cuda_src/<src>, compiled for `arch`
    with the options CuPy uses; the caller destroys it. Raises RuntimeError with NVRTC's
    log when the compile fails."""
    from cupy_backends.cuda.libs import nvrtc

    options = nvrtc_options(arch)
    prog = nvrtc.createProgram(source(src), src, [], [])
    try:
        for e in part:
            nvrtc.addNameExpression(prog, e)
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError:
            raise RuntimeError(
                f"NVRTC failed on {src} for {arch}:\n{nvrtc.getProgramLog(prog)}"
            ) from None
    except BaseException:
        nvrtc.destroyProgram(prog)
        raise
    return prog


def _parts(sources: dict[str, list[str]] | None, chunk: int):
    sources = all_specializations() if sources is None else sources
    for src, exprs in sources.items():
        for i in range(0, len(exprs), chunk):
            yield src, exprs[i:i + chunk]


def programs(arch: str, sources: dict[str, list[str]] | None = None, chunk: int = 400):
    """Compile every specialization with NVRTC for `arch` (e.g. "sm_90") in as few programs
    as possible, with the options CuPy uses; yields (source, name expressions, program)
    for each compiled program, destroyed once the caller moves on. Raises RuntimeError with
    NVRTC's log on the first failure. Needs NVRTC, not a GPU."""
    from cupy_backends.cuda.libs import nvrtc

    for src, part in _parts(sources, chunk):
        prog = _compiled(src, part, arch)
        try:
            yield src, part, prog
        finally:
            nvrtc.destroyProgram(prog)


def compile_all(arch: str, sources: dict[str, list[str]] | None = None, chunk: int = 40,
                workers: int | None = None) -> dict[str, int]:
    """Compile every specialization with NVRTC for `arch`, in programs of `chunk` name
    expressions on `workers` threads (default: one a CPU, at most 8, since each compile
    holds its own memory; NVRTC runs without the GIL, and programs this small cost no more
    in all than large ones), and check that each name expression made a kernel. Returns
    the count per source."""
    from concurrent.futures import ThreadPoolExecutor

    from cupy_backends.cuda.libs import nvrtc

    def one(job):
        src, part = job
        prog = _compiled(src, part, arch)
        try:
            for e in part:
                nvrtc.getLoweredName(prog, e)
        finally:
            nvrtc.destroyProgram(prog)
        return src, len(part)

    counts: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
        for src, n in pool.map(one, list(_parts(sources, chunk))):
            counts[src] = counts.get(src, 0) + n
    return counts
