"""The compile check: every specialization each kernel family can launch, compiled with NVRTC
for an architecture, with the options CuPy uses, without a GPU (tests/_cuda/test_compile.py,
benchmarks/sass_audit.py)."""

from __future__ import annotations

import os

from . import groupwise, microscaling, symmetric, zero_point
from .kernels import OPTIONS, source


def all_specializations() -> dict[str, list[str]]:
    """Every name expression the library can launch, by source file."""

    table: dict[str, list[str]] = {}
    for family in (symmetric, groupwise, zero_point, microscaling):
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
