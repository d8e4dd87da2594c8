"""The benchmark harness's switch between source folders (A/B runs of kernel variants)."""

import shutil

from benchmarks import harness
from cuquant import _kernels


def test_use_sources_switches_folders_and_back(tmp_path):
    shipped = _kernels.source("symmetric.cu")
    variant = tmp_path / "cuda_src"
    shutil.copytree(_kernels.source_dir(), variant)
    (variant / "symmetric.cu").write_text("// variant\n" + (variant / "symmetric.cu").read_text())
    try:
        harness.use_sources(variant)
        assert _kernels.source("symmetric.cu") == "// variant\n" + shipped
    finally:
        harness.use_sources(None)
    assert _kernels.source("symmetric.cu") == shipped
