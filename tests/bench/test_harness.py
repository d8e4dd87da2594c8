"""The benchmark's host-time measurement (the quietest CPU, passes) and what it writes: one
folder per GPU holding the latest run's table as Markdown, CSV and a plot."""

import contextlib
import csv
import os

import pytest

from benchmarks import __main__ as bench
from benchmarks import harness


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


def test_a_call_beside_its_base_reports_the_median_of_its_passes_differences(monkeypatch):
    """Each pass measures base and call alternately, three rounds each, on one CPU; the
    pass's difference is between their lowest rounds, and over_us is the median over the
    passes of those differences."""
    measured = {"torch": iter([13.0, 12.5, 14.0, 20.0, 19.0, 19.5, 12.0, 12.2, 12.1]),
                "cupy": iter([11.0, 10.0, 10.5, 15.0, 16.0, 18.0, 9.0, 9.1, 9.2]),
                "empty": iter([4.0, 4.5, 4.2])}
    order = []
    monkeypatch.setattr(harness, "quietest_cpu", lambda probe: (5, 0.0))
    monkeypatch.setattr(harness, "pinned", lambda cpu: contextlib.nullcontext())

    def per_call(fn, rounds):
        order.append(fn())
        return next(measured[order[-1]])

    monkeypatch.setattr(harness, "host_us_per_call", per_call)
    host = harness.HostTimes(probe=lambda: "empty")
    host.add_beside((0, "torch"), lambda: "torch", lambda: "cupy")
    assert order == ["cupy", "torch"] * 3 + ["empty"]
    host.passes(2, gap_s=0.0)
    res = host.result((0, "torch"))
    # passes: torch 12.5 over cupy 10.0, 19.0 over 15.0, 12.0 over 9.0: 2.5, 4.0, 3.0
    assert res["host_us"] == 12.0 and res["host_passes"] == 3
    assert res["over_us"] == 3.0


def test_back_to_back_rounds_take_turns_in_an_order_reversed_every_other_round(monkeypatch):
    """Each round times every function's 100 calls in turn, the order reversed every other
    round, so that a drift of the GPU over the measurement falls on each alike; each
    function's figure is the median of its rounds, per call."""
    import types

    order, clock = [], [0.0]
    cost = {"cupy": 1.0, "torch": 1.5}  # seconds a round's 100 calls take

    class Device:
        def synchronize(self):
            if order and order[-1] != "sync":
                clock[0] += cost[order[-1]]
                order.append("sync")

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device))
    monkeypatch.setattr(harness, "_cp", lambda: fake)
    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])

    def call(name):
        def fn():
            if not order or order[-1] != name:
                order.append(name)
        return fn

    a, b = harness.back_to_back_us(call("cupy"), call("torch"), calls=100, reps=4)
    rounds = [name for name in order if name != "sync"]
    # the warm-up calls, then A B, B A, A B, B A
    assert rounds == ["cupy", "torch"] + ["cupy", "torch", "torch", "cupy"] * 2
    assert (a, b) == (1.0 / 100 * 1e6, 1.5 / 100 * 1e6)


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


@pytest.mark.parametrize("name, slug", [("NVIDIA H200", "h200"),
                                        ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
                                        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
                                        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb")])
def test_each_gpu_has_its_own_folder(name, slug, tmp_path):
    assert bench.gpu_slug(name) == slug
    assert bench.results_folder(str(tmp_path), name) == str(tmp_path / slug)
    assert bench.results_folder(str(tmp_path), name, "partial") == str(tmp_path / f"{slug}-partial")


def _run_rows():
    env = {"date": "2030-01-01 00:00 UTC", "gpu": "NVIDIA H200", "cupy": "14.2.0"}
    rows = [{"op": "quantize_int8_per_channel", "variant": "", "dtype": "bfloat16",
             "shape": "16384x7168", "target": 0.92, "us": 85.2, "bytes": 352321536,
             "logical_bytes": 352321536, "tbps": 4.135, "frac_copy": 0.965, "compile_frac": 0.4},
            {"op": "quantize_fp8_per_block", "variant": "", "dtype": "bfloat16",
             "shape": "16384x7168", "target": 0.92, "error": "RuntimeError: out of memory"}]
    return env, 4.286e12, rows


def test_a_run_replaces_the_previous_table_csv_and_plot(tmp_path):
    env, copy_bw, rows = _run_rows()
    base = str(tmp_path / "benchmark")
    (tmp_path / "benchmark.png").write_bytes(b"the previous run's plot")
    md = bench.write(base, env, copy_bw, rows, with_plot=False)
    assert not (tmp_path / "benchmark.png").exists(), "a stale plot would not match the table"
    assert (tmp_path / "benchmark.md").read_text() == md
    assert md.startswith("# cuquant benchmark, NVIDIA H200, 2030-01-01 00:00 UTC")
    assert "**4.286 TB/s**" in md
    assert "| quantize_int8_per_channel |  | bfloat16 | 16384x7168 | 85.2 | 4.135 | 0.965 | 0.920 |" in md
    assert "RuntimeError: out of memory |" in md
    with open(tmp_path / "benchmark.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert [r["op"] for r in got] == ["quantize_int8_per_channel", "quantize_fp8_per_block"]
    assert got[0]["frac_copy"] == "0.965" and got[0]["bytes"] == "352321536"
    assert got[1]["error"] == "RuntimeError: out of memory"


def test_a_run_draws_its_plot(tmp_path):
    pytest.importorskip("matplotlib")
    env, copy_bw, rows = _run_rows()
    bench.write(str(tmp_path / "benchmark"), env, copy_bw, rows)
    assert (tmp_path / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_committed_results_are_one_run_per_gpu():
    """benchmarks/results/ holds, for each GPU, the latest run's table in both forms."""
    root = os.path.join(os.path.dirname(bench.__file__), "results")
    if not os.path.isdir(root):
        pytest.skip("no results in this tree (an sdist carries none)")
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        assert os.path.isdir(folder) and name == bench.gpu_slug(name.replace("-", " ")), name
        files = set(os.listdir(folder))
        assert {"benchmark.md", "benchmark.csv"} <= files <= {"benchmark.md", "benchmark.csv",
                                                             "benchmark.png"}, (name, files)
