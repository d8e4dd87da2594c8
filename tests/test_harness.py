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


def test_time_variants_compares_with_the_first_and_times_each():
    import numpy as np

    class Clock:
        def time_ms(self, fn, reps):
            fn()
            return {"a": 1.0, "b": 2.0, "c": 3.0}[current[0]]

    current = ["a"]
    outputs = {"a": (np.float16([1.0, -0.0]), np.uint8([3])),
               "b": (np.float16([1.0, 0.0]), np.uint8([3])),    # -0 and +0 differ in bits
               "c": (np.float16([1.0, -0.0]), np.uint8([3]))}
    times, notes = harness.time_variants(
        "abc", lambda name: current.__setitem__(0, name), lambda: outputs[current[0]],
        Clock(), rounds=2, reps=1)
    assert times == {"a": [1.0, 1.0], "b": [2.0, 2.0], "c": [3.0, 3.0]}
    assert notes == ["DIFF b output 0"]
