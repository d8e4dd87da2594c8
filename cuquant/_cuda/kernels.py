"""The kernel loader.

The CUDA sources live in the top-level `cuda_src/` of the repository; the wheel carries
them as `cuquant/cuda_src/`. Both are found through importlib.resources, nothing is ever
written into the package. A source's `#include "..."` lines are inlined here, so the text
handed to NVRTC (and hashed by CuPy's disk cache) covers every header it uses.

Each specialization (one C++ name expression) becomes its own RawModule, compiled on first
use for the device it runs on and memoized per device; CuPy's disk cache keeps the binary
across processes. Importing cuquant needs neither CuPy nor NVRTC. The compile check of
every specialization is in `compile`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import pathlib
import re
import threading

from .._core.arrays import require_cupy

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
    """The text of cuda_src/<name> with its quoted includes inlined (each header once, where
    it is first included). An include names a path under cuda_src/ ("common/codes.cuh"),
    whichever file includes it, so NVRTC needs no include path."""
    folder = source_dir()
    seen: set[str] = set()

    def expand(fname: str) -> str:
        path = folder
        for part in fname.split("/"):
            path = path.joinpath(part)
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
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
_recorders: list = []  # the lists of the `recording` blocks now open


def function(src: str, name_expression: str, device: int):
    """The compiled kernel for one specialization on one device (memoized, thread-safe)."""
    for built in _recorders:
        built.append(name_expression)
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


@contextlib.contextmanager
def recording():
    """Within the block, the name expression of every kernel that a launch plan asks for is
    appended to the list this yields, in order: the hook for tests that check which kernel
    a call takes. Plans are made once per problem and kept; `launch.clear_plans()` makes
    the next calls plan afresh."""
    built: list = []
    _recorders.append(built)
    try:
        yield built
    finally:
        _recorders.remove(built)
