"""The benchmark harness: its switch between source folders (A/B runs of kernel variants) and
its host-time measurement (the quietest CPU, passes)."""

import contextlib
import os
import shutil

import pytest

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


needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                    reason="threads cannot be pinned on this platform")


@needs_affinity
def test_quietest_cpu_picks_the_quickest_and_restores_the_affinity(monkeypatch):
    allowed = os.sched_getaffinity(0)
    cpus = sorted(allowed)
    quiet = cpus[len(cpus) // 2]
    seen = []

    def host_us(probe, calls, rounds):  # the probe runs pinned to one CPU at a time
        (cpu,) = os.sched_getaffinity(0)
        seen.append(cpu)
        return 4.0 if cpu == quiet else 6.0 + cpu

    monkeypatch.setattr(harness, "host_us_per_call", host_us)
    assert harness.quietest_cpu(lambda: None) == (quiet, 4.0)
    assert seen == cpus
    assert os.sched_getaffinity(0) == allowed


@needs_affinity
def test_pinned_runs_the_block_on_one_cpu_and_restores():
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    with harness.pinned(cpu):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == allowed
    with pytest.raises(KeyError):
        with harness.pinned(cpu):
            raise KeyError
    assert os.sched_getaffinity(0) == allowed
    with harness.pinned(None):
        assert os.sched_getaffinity(0) == allowed


def test_host_times_keep_each_calls_lowest_pass_and_its_state(monkeypatch):
    """Each pass measures every call kept, pinned to the quietest CPU of the moment; a
    call's host time is its lowest pass, reported with that pass's empty launch and CPU."""
    measured = {"a": iter([9.0, 8.0, 12.0]), "b": iter([10.0, 11.0, 9.5]),
                "empty": iter([4.1, 4.0, 6.0, 6.2, 4.3, 4.4])}
    cpus = iter([3, 7, 3, 5, 1, 2])
    monkeypatch.setattr(harness, "quietest_cpu", lambda probe: (next(cpus), 0.0))
    monkeypatch.setattr(harness, "pinned", lambda cpu: contextlib.nullcontext())
    monkeypatch.setattr(harness, "host_us_per_call", lambda fn, rounds: next(measured[fn()]))
    host = harness.HostTimes(probe=lambda: "empty")
    host.add(0, lambda: "a")
    host.add(4, lambda: "b")
    assert host.result(0) == {"host_us": 9.0, "launch_us": 4.1, "host_cpu": 3,
                              "host_median_us": 9.0, "launch_median_us": 4.1, "host_passes": 1}
    host.passes(2, gap_s=0.0)
    assert host.result(0) == {"host_us": 8.0, "launch_us": 6.0, "host_cpu": 3,
                              "host_median_us": 9.0, "launch_median_us": 4.3, "host_passes": 3}
    assert host.result(4) == {"host_us": 9.5, "launch_us": 4.4, "host_cpu": 2,
                              "host_median_us": 10.0, "launch_median_us": 4.4, "host_passes": 3}


def test_host_times_keep_no_call_that_raises(monkeypatch):
    monkeypatch.setattr(harness, "quietest_cpu", lambda probe: (0, 0.0))
    monkeypatch.setattr(harness, "pinned", lambda cpu: contextlib.nullcontext())
    monkeypatch.setattr(harness, "host_us_per_call", lambda fn, rounds: fn())

    def fails():
        raise RuntimeError("out of memory")

    host = harness.HostTimes(probe=lambda: 4.0)
    with pytest.raises(RuntimeError):
        host.add(0, fails)
    host.add(1, lambda: 9.0)
    host.passes(1, gap_s=0.0)
    assert list(host.calls) == [1]
    assert host.result(1)["host_passes"] == 2


def test_source_ab_loads_each_folder_and_reports_fractions_of_copy(tmp_path):
    import numpy as np

    for name in ("head", "new"):
        shutil.copytree(_kernels.source_dir(), tmp_path / name)
    (tmp_path / "new" / "symmetric.cu").write_text("// new\n" + (tmp_path / "new" / "symmetric.cu").read_text())

    class Clock:  # 1 ms under head, 2 ms under new
        def time_ms(self, fn, reps):
            fn()
            return 2.0 if _kernels.source("symmetric.cu").startswith("// new") else 1.0

    lines = []
    try:
        ab = harness.SourceAB(tmp_path, ["head", "new"], rounds=2, timer=Clock(), copy_bw=8e3,
                              out=lambda line, flush: lines.append(line))
        outputs = {False: np.uint8([1, 2]), True: np.uint8([1, 3])}
        fractions = ab.report("case", lambda: outputs[_kernels.source("symmetric.cu").startswith("// new")],
                              [np.zeros(2, np.float32)])
    finally:
        harness.use_sources(None)
    # 8 bytes in, 2 out: 10 bytes in 1 ms is 1e4 B/s, 1.25 of the copy's 8e3
    assert fractions == {"head": [1.25, 1.25], "new": [0.625, 0.625]}
    assert lines == ["case" + " " * 31 + "head 1.250/1.250  new 0.625/0.625  DIFF new output 0"]


def test_source_ab_for_script_takes_names_and_rounds_from_the_command_line(tmp_path, monkeypatch):
    script = tmp_path / "ab.py"
    kw = dict(timer=object(), copy_bw=1.0)
    monkeypatch.setattr("sys.argv", [str(script)])
    monkeypatch.delenv("AB_ROUNDS", raising=False)
    ab = harness.SourceAB.for_script(str(script), ("head", "new"), **kw)
    assert (ab.folder, ab.names, ab.rounds) == (tmp_path, ["head", "new"], 3)
    monkeypatch.setattr("sys.argv", [str(script), "head,b,c"])
    monkeypatch.setenv("AB_ROUNDS", "5")
    ab = harness.SourceAB.for_script(str(script), ("head", "new"), **kw)
    assert (ab.folder, ab.names, ab.rounds) == (tmp_path, ["head", "b", "c"], 5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_smooth_input_plants_rows_that_divide_again(dtype):
    import numpy as np
    from cuquant import _registry

    x, smooth = harness.smooth_input(np, np.random.default_rng(3), 20, 8, dtype, special=True)
    (plain, plain_smooth), _ = _registry._smooth(np, np.random.default_rng(3), (20, 8), dtype)
    assert x.dtype == plain.dtype and x.shape == (20, 8)
    assert smooth.tobytes() == plain_smooth.tobytes()
    f = x.astype(np.float64)
    p = plain.astype(np.float64)
    assert np.isnan(f[3, 5]) and np.isinf(f[7, 1]) and not f[11].any()
    if dtype == "bfloat16":
        assert 0 < np.abs(f[13]).max() < 1e-25
    else:
        assert (np.abs(f[13]) == 2.0 ** -24).all() and (np.signbit(f[13]) == np.signbit(p[13])).all()
    huge = [17] if dtype == "bfloat16" else []
    assert all(np.abs(f[r]).max() > 1e25 for r in huge)
    untouched = [r for r in range(20) if r not in [3, 7, 11, 13] + huge]
    assert f[untouched].tobytes() == p[untouched].tobytes()
