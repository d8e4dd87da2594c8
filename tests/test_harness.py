"""The benchmark harness's switch between source folders (A/B runs of kernel variants)."""

import shutil

from benchmarks import harness
from cuquant import _fast, _kernels, _symmetric, groupwise


def test_use_sources_switches_folders_and_back(tmp_path):
    shipped = _kernels.source("symmetric.cu")
    variant = tmp_path / "cuda_src"
    shutil.copytree(_kernels.source_dir(), variant)
    (variant / "symmetric.cu").write_text("// variant\n" + (variant / "symmetric.cu").read_text())
    _symmetric._plans["stale"] = groupwise._plans["stale"] = _fast._table["stale"] = None
    try:
        harness.use_sources(variant)
        assert _kernels.source("symmetric.cu") == "// variant\n" + shipped
        assert "stale" not in _symmetric._plans and "stale" not in groupwise._plans
        assert "stale" not in _fast._table
    finally:
        harness.use_sources(None)
    assert _kernels.source("symmetric.cu") == shipped
