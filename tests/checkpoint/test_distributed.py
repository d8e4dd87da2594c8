"""The checkpoint command on a Dask cluster: byte for byte the single-process output
(shards, index, config, the report's error figures), with a worker killed mid-run, and
continued after its client was killed; dequantize too; refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from cuquant import checkpoint as ckpt  # noqa: E402
from cuquant.checkpoint import CheckpointError  # noqa: E402
from cuquant.checkpoint.safetensors import save_file  # noqa: E402
from cuquant.cli import main  # noqa: E402

from test_checkpoint import make_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(chunk_elements=4096, max_shard_size="200KB")  # many bands, several shards


def files_of(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def assert_same_output(a: Path, b: Path) -> None:
    fa, fb = files_of(a), files_of(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs"


def assert_same_report(r1, r2) -> None:
    j1, j2 = r1.to_json(), r2.to_json()
    assert j1["tensors"] == j2["tensors"] and j1["groups"] == j2["groups"]
    assert j1["summary"] == j2["summary"] and j1["warnings"] == j2["warnings"]


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=50)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "in"
    make_checkpoint(path, np.random.default_rng(7))
    return path


@pytest.fixture(scope="module")
def single(model, tmp_path_factory):
    """Single-process outputs, by format (made once)."""
    base = tmp_path_factory.mktemp("single")
    made = {}

    def get(fmt):
        if fmt not in made:
            made[fmt] = (base / fmt, ckpt.quantize_checkpoint(model, base / fmt, fmt, **SMALL))
        return made[fmt]
    return get


@pytest.mark.parametrize("fmt", ["fp8-block", "W4A16_ASYM", "AWQ", "W8A8", "int4-group"])
def test_cluster_equals_single_process(client, model, single, tmp_path, fmt):
    want, rep = single(fmt)
    got = ckpt.quantize_checkpoint(model, tmp_path / "q", fmt, scheduler=client, **SMALL)
    assert_same_output(want, tmp_path / "q")
    assert_same_report(rep, got)
    assert not list(tmp_path.glob(".*partial*"))
    # Dequantized on the cluster: the single-process restoration, byte for byte.
    ckpt.dequantize_checkpoint(want, tmp_path / "d1", chunk_elements=4096)
    ckpt.dequantize_checkpoint(want, tmp_path / "d2", chunk_elements=4096, scheduler=client)
    assert_same_output(tmp_path / "d1", tmp_path / "d2")


class KillOnce(distributed.WorkerPlugin):
    """Ends its worker's process the first time, over all workers, that a task has
    written its bytes but not yet reported them (the marker file says it was done)."""

    name = "kill-once"

    def __init__(self, marker: str):
        self.marker = marker

    def setup(self, worker):
        from cuquant.checkpoint import distributed as dist

        finish, marker = dist._Writer.finish, self.marker
        calls = [0]

        def dying(writer):
            calls[0] += 1
            if calls[0] == 3:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    pass
                else:
                    os._exit(1)
            finish(writer)

        dist._Writer.finish = dying


def test_worker_killed_mid_run(model, single, tmp_path):
    want, rep = single("W4A16")
    marker = tmp_path / "killed"
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", silence_logs=50) as cluster, \
            distributed.Client(cluster) as c:
        c.register_plugin(KillOnce(str(marker)))
        got = ckpt.quantize_checkpoint(model, tmp_path / "q", "W4A16", scheduler=c, **SMALL)
    assert marker.exists()   # a worker did die, and its task ran again elsewhere
    assert_same_output(want, tmp_path / "q")
    assert_same_report(rep, got)


_CLIENT = """
import os, signal, sys
from cuquant import checkpoint as ckpt
from cuquant.checkpoint import distributed
distributed._SYNC_EVERY = 0   # a journal write after every task: the kill lands mid-journal
seen = []
def progress(done_t, total_t, done_b, total_b, name):
    seen.append(done_b)
    if len(seen) == 12:
        os.kill(os.getpid(), signal.SIGKILL)
ckpt.quantize_checkpoint(sys.argv[1], sys.argv[2], "fp8-block", scheduler=sys.argv[3],
                         progress=progress, chunk_elements=4096, max_shard_size="200KB")
"""


def test_resume_after_the_client_was_killed(client, model, single, tmp_path):
    want, rep = single("fp8-block")
    out = tmp_path / "q"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", _CLIENT, str(model), str(out),
                          client.scheduler.address], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == -signal.SIGKILL, res.stderr
    partial = tmp_path / ".q.partial-cluster"
    lines = (partial / ".cuquant-journal").read_text().splitlines()
    done = len(lines) - 1
    assert done >= 11 and not out.exists()

    # Refused, and the partial output kept, when the options or the input changed.
    with pytest.raises(CheckpointError, match="other options"):
        ckpt.quantize_checkpoint(model, out, "fp8-block", scheduler=client, resume=True,
                                 chunk_elements=8192, max_shard_size="200KB")
    shard = sorted(model.glob("*.safetensors"))[0]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    try:
        with pytest.raises(CheckpointError, match="input changed"):
            ckpt.quantize_checkpoint(model, out, "fp8-block", scheduler=client, resume=True,
                                     **SMALL)
    finally:
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (partial / ".cuquant-journal").read_text().splitlines() == lines

    with distributed.get_task_stream(client) as ts:
        got = ckpt.quantize_checkpoint(model, out, "fp8-block", scheduler=client, resume=True,
                                       **SMALL)
    ran = {t["key"] for t in ts.data if str(t["key"]).startswith("cuquant-")}
    with distributed.get_task_stream(client) as ts:
        ckpt.quantize_checkpoint(model, tmp_path / "fresh", "fp8-block", scheduler=client,
                                 **SMALL)
    total = {t["key"] for t in ts.data if str(t["key"]).startswith("cuquant-")}
    assert len(ran) == len(total) - done   # only the unfinished tasks ran again
    assert_same_output(want, out)
    assert_same_report(rep, got)
    assert not partial.exists()


def test_failed_run_leaves_nothing(client, tmp_path):
    """A refusal raised on a worker (AWQ's float16 scales cannot hold the weight) fails
    the run as it fails the single-process one, and the partial output goes."""
    w = np.full((64, 256), 1e6, np.float32).astype(ml_dtypes.bfloat16)
    save_file({"layers.0.mlp.up_proj.weight": w}, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match="float16"):
        ckpt.quantize_checkpoint(tmp_path / "m.safetensors", tmp_path / "out", "AWQ",
                                 scheduler=client)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_refusals(client, model, tmp_path):
    import dask

    with pytest.raises(CheckpointError, match="local:N"):
        ckpt.quantize_checkpoint(model, tmp_path / "q", "W8A8", scheduler="local:0")
    with pytest.raises(CheckpointError, match="a distributed.Client; got 42"):
        ckpt.quantize_checkpoint(model, tmp_path / "q", "W8A8", scheduler=42)
    with pytest.raises(CheckpointError, match="no Dask scheduler answered"):
        ckpt.quantize_checkpoint(model, tmp_path / "q", "W8A8", scheduler="nonsense://x:1")
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(CheckpointError, match="no Dask scheduler answered"):
            ckpt.quantize_checkpoint(model, tmp_path / "q", "W8A8",
                                     scheduler="tcp://127.0.0.1:9")
    with pytest.raises(CheckpointError, match="quantize_checkpoint: resume=True"):
        ckpt.quantize_checkpoint(model, tmp_path / "q", "W8A8", resume=True)
    with pytest.raises(CheckpointError, match="nothing to resume"):
        ckpt.quantize_checkpoint(model, tmp_path / "q", "W8A8", scheduler=client, resume=True)
    assert not (tmp_path / "q").exists() and not list(tmp_path.glob(".*"))


def test_command(model, single, tmp_path, capsys):
    want, _ = single("W8A8")
    rc = main(["quantize", str(model), str(tmp_path / "q"), "-f", "W8A8", "--scheduler",
               "local:2", "--max-shard-size", "200KB", "--no-progress", "--report",
               str(tmp_path / "r.json")])
    assert rc == 0
    # The single-process run above was made with small bands: the codes do not depend on
    # them, so the command's default bands give the same bytes.
    assert_same_output(want, tmp_path / "q")
    err = capsys.readouterr().err
    assert "dask: 2 workers" in err and "dashboard http" in err
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["quantized"] > 0
    rc = main(["dequantize", str(tmp_path / "q"), str(tmp_path / "d"), "--resume"])
    assert rc == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "cuquant: error: dequantize_checkpoint: resume=True continues a run on a Dask "
        "cluster; pass scheduler= too (--scheduler)"]


def test_no_dask_without_a_scheduler(model, tmp_path):
    code = ("import sys\nfrom cuquant import checkpoint as c\n"
            f"c.quantize_checkpoint({str(model)!r}, {str(tmp_path / 'q')!r}, 'W8A8')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')"
            " or m == 'cuquant.checkpoint.distributed'))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
    assert res.stdout.strip() == "[]"


def test_partial_output_of_another_run(client, model, single, tmp_path):
    """A partial output whose journal another command holds is refused; one left by a
    dead command is replaced by a new run without resume."""
    import fcntl

    want, _ = single("W8A8")
    partial = tmp_path / ".q.partial-cluster"
    partial.mkdir()
    (partial / "model-00001-of-00009.safetensors").write_bytes(b"stale")
    with open(partial / ".cuquant-journal", "wb") as held:
        held.write(b'{"cuquant": 1}\n')
        held.flush()
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        for resume in (False, True):
            with pytest.raises(CheckpointError, match="another run is writing it"):
                ckpt.quantize_checkpoint(model, tmp_path / "q", "W8A8", scheduler=client,
                                         resume=resume, **SMALL)
        assert (partial / "model-00001-of-00009.safetensors").exists()
    ckpt.quantize_checkpoint(model, tmp_path / "q", "W8A8", scheduler=client, **SMALL)
    assert_same_output(want, tmp_path / "q")
    assert not partial.exists()


def test_tasks_share_one_backend_a_process():
    """A task unpickles the backend it was given as its process's one backend of that kind
    (so its page-locked pool serves every band there); a cluster client's GPU backend, which
    holds no CuPy of its own, pickles to the workers' and holds no host memory."""
    import pickle

    from cuquant.checkpoint import backend as be

    cpu = be.select_backend("cpu")
    assert be.select_backend("cpu") is cpu
    assert pickle.loads(pickle.dumps(cpu)) is cpu
    client_side = be.Backend("cuda", None)
    assert client_side.host_buffer((3, 5), np.float32).shape == (3, 5)
    client_side.release_host_memory()
    if be.gpu_available():  # a worker with a GPU takes its own CUDA backend
        assert pickle.loads(pickle.dumps(client_side)) is be.select_backend("cuda")
    else:  # one without refuses the task
        with pytest.raises(CheckpointError, match="no CUDA device"):
            pickle.loads(pickle.dumps(client_side))
    be.release_host_memory()
