"""Shared fixtures: the `gpu` marker skips without a CUDA device; `xp` runs one test body
against NumPy and (on a GPU machine) CuPy; every test draws fresh random inputs from a
seed it reports on failure."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

# The folders of tests mirror the package; test modules import helpers from one another by
# module name (`from test_gpu import ...`, `from _util import ...`), whichever folder they
# are in, so every folder is on the path (module names are unique across folders).
_TESTS = Path(__file__).resolve().parent
for _folder in [_TESTS] + sorted(p for p in _TESTS.iterdir()
                                 if p.is_dir() and not p.name.startswith((".", "__"))):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device
        return False


GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A fresh generator per test; the seed is printed so a failure can be replayed
    (set CUQUANT_TEST_SEED to replay)."""
    seed = int(os.environ.get("CUQUANT_TEST_SEED", np.random.SeedSequence().entropy % (1 << 32)))
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module a test body runs against."""
    if request.param == "numpy":
        return np
    import cupy

    return cupy
