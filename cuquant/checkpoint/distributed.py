"""Quantize and dequantize a checkpoint on a Dask cluster (``scheduler=``, ``--scheduler``).

The client plans as the single-process run does (the same items, shards and headers),
writes every output shard's header and sizes the file, then hands the work out as tasks:
one band of rows of a weight (the bands the single-process run streams), a whole tensor
where the format stores it transposed (AWQ), or a piece of a tensor copied unchanged. A
worker reads its band at the input header's offsets and writes its bytes at their place in
the output shard (``os.pwrite``), so which worker ran what, and how often, never changes
the output: a task is a pure function of the input writing fixed bytes at fixed offsets,
and a task retried after its worker died writes them again. The per-band error sums come
back to the client, which adds them in band order, as the single-process run does. The
client writes the index, config.json and the other files, then renames the output.

The output lives in ``.NAME.partial-cluster`` beside its final name until it is complete.
A journal there lists the tasks done (with their error sums), after a first line holding
the input files' sizes and modification times and a hash of the plan: a run whose client
died continues with ``resume=True``, redoing only the tasks not listed, and is refused
when the input or the plan changed. A run that fails or is interrupted removes it.

Workers must see the input and the output under the same paths (a shared filesystem).
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .backend import Backend, gpu_available, release_host_memory
from .engines import EngineFormat
from .formats import CheckpointError, CPU_CHUNK, GPU_CHUNK
from .plan import _Item, _shard_names
from .read import _Module, Checkpoint, open_checkpoint
from .report import _worse
from .safetensors import header_bytes, layout, SafetensorsError, TensorSpec
from .write import _bands, _check_space, _other_files, _Output, _shard

COPY_PIECE = 256 << 20  # bytes of an unchanged tensor a task copies
_JOURNAL = ".cuquant-journal"
_RETRIES = 3  # a task that raises is run again this many times (a worker that dies: Dask's own)
_SYNC_EVERY = 2.0  # seconds between journal writes: the shards written are synced first


def on_cluster(fn, kwargs: dict):
    """Run `fn` (`quantize_checkpoint` or `dequantize_checkpoint`) with `kwargs` on the
    cluster named by ``kwargs["scheduler"]``: connect (or start a local one), choose the
    workers' backend, run, and close what was started. ``resume`` without a scheduler is
    refused."""
    if kwargs.get("scheduler") is None:
        raise CheckpointError(f"{fn.__name__}: resume=True continues a run on a Dask cluster; "
                              "pass scheduler= too (--scheduler)")
    kwargs = {k: v for k, v in kwargs.items() if k != "_cluster"}
    progress = kwargs.get("progress")
    with _Cluster(kwargs["scheduler"], kwargs.get("device", "auto"), _note_of(progress)) as cl:
        return fn(**kwargs, _cluster=_Runner(cl, kwargs))


def _note_of(progress):
    note = getattr(progress, "note", None)
    return note if callable(note) else (lambda text: None)


# ---------------------------------------------------------------------------------------
# The cluster

class _Cluster:
    """A `distributed.Client` for `scheduler`: an address (``tcp://host:8786``), a
    scheduler file (``*.json``), ``local:N`` (N worker processes on this machine: a
    dask_cuda `LocalCUDACluster` when there are GPUs and dask_cuda is installed, else a
    `LocalCluster`) or a Client (used as it is, never closed here)."""

    def __init__(self, scheduler, device: str, note):
        try:
            import distributed
        except ImportError:
            raise CheckpointError("a scheduler needs dask.distributed: pip install "
                                  "'cuquant[dask]'") from None
        self.note = note
        self.cluster = None
        self.own = True
        if isinstance(scheduler, distributed.Client):
            self.client, self.own = scheduler, False
        elif not isinstance(scheduler, str) or not scheduler:
            raise CheckpointError("scheduler must be a Dask scheduler address, a scheduler "
                                  f"file, 'local:N' or a distributed.Client; got {scheduler!r}")
        elif scheduler.startswith("local"):
            self.client = self._local(scheduler, distributed)
        else:
            self.client = self._connect(scheduler, distributed)
        try:
            self.backend = self._backend(device)
        except BaseException:
            self.close()
            raise
        link = self.client.dashboard_link if self.client.scheduler_info().get(
            "services", {}).get("dashboard") else None
        workers = len(self.client.scheduler_info()["workers"])
        self.note(f"dask: {workers} worker{'s' if workers != 1 else ''} at "
                  f"{self.client.scheduler.address}, on {self.backend.name}"
                  + (f"; dashboard {link}" if link else ""))

    def _local(self, text: str, distributed):
        import logging

        import dask

        _, _, count = text.partition(":")
        if not count.isdigit() or int(count) < 1:
            raise CheckpointError(f"scheduler {text!r}: expected local:N, N a number of worker "
                                  "processes >= 1")
        n = int(count)
        quiet = dict(silence_logs=logging.CRITICAL, dashboard_address=":0")
        # Dask's nannies set MALLOC_TRIM_THRESHOLD_, which keeps glibc from raising its mmap
        # threshold: every band's temporaries would be fresh pages (a third slower on the
        # NumPy backend). Left unset in the workers started here.
        with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_":
                              None}):
            if gpu_available():
                try:
                    from dask_cuda import LocalCUDACluster
                except ImportError:
                    self.note("dask_cuda is not installed: a LocalCluster, whose workers use "
                              "the first GPU (pip install dask-cuda for a worker per GPU)")
                else:
                    self.cluster = LocalCUDACluster(n_workers=n, threads_per_worker=1, **quiet)
            if self.cluster is None:
                self.cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1,
                                                        processes=True, **quiet)
        return distributed.Client(self.cluster)

    def _connect(self, address: str, distributed):
        try:
            # Within Dask's connect timeout (distributed.comm.timeouts.connect).
            if address.endswith(".json"):
                client = distributed.Client(scheduler_file=address)
            else:
                client = distributed.Client(address)
        except (OSError, TimeoutError, ValueError) as e:
            raise CheckpointError(f"scheduler {address!r}: no Dask scheduler answered "
                                  f"({type(e).__name__}: {e})") from None
        try:
            client.wait_for_workers(1, timeout=60)
        except (TimeoutError, OSError):
            client.close()
            raise CheckpointError(f"scheduler {address!r}: no workers joined it within "
                                  "60 s") from None
        return client

    def _backend(self, device: str) -> Backend:
        if device not in ("auto", "cpu", "cuda"):
            raise CheckpointError(f"device must be auto, cpu or cuda; got {device!r}")
        if device == "cpu":
            return Backend("cpu", np)
        gpus = self.client.run(gpu_available)
        if device == "cuda" and not all(gpus.values()):
            lacking = sorted(w for w, ok in gpus.items() if not ok)
            raise CheckpointError(f"device cuda: workers without a usable GPU: "
                                  f"{', '.join(lacking[:3])}; use device cpu")
        if gpus and all(gpus.values()):
            return Backend("cuda", None)  # the workers' CuPy: tasks choose it where they run
        return Backend("cpu", np)

    def close(self) -> None:
        if self.own:
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------
# The output: a fixed temporary name, its journal, and a lock

class _ClusterOutput(_Output):
    """`_Output` under a name that a later run finds (``.NAME.partial-cluster``), holding
    the journal, locked while a client writes it."""

    def __init__(self, dst: Path, overwrite: bool, protect, resume: bool):
        self.dst = self.destination(dst, overwrite, protect)
        self.overwrite = overwrite
        self.tmp = self.dst.parent / f".{self.dst.name}.partial-cluster"
        self.journal = None
        self.keep = False  # a refused resume leaves the partial output for a right one
        path = self.tmp / _JOURNAL
        if resume:
            if not path.is_file():
                raise CheckpointError(f"{dst}: nothing to resume (no partial output "
                                      f"{self.tmp.name} with a journal)")
            self._lock(open(path, "r+b"), dst)  # noqa: SIM115 - held until commit/discard
            self.resumed = True
        else:
            if path.is_file():
                self._lock(open(path, "r+b"), dst)  # noqa: SIM115
                self.journal.close()
            if self.tmp.exists():
                shutil.rmtree(self.tmp)
            self.tmp.mkdir()
            self._lock(open(path, "w+b"), dst)  # noqa: SIM115
            self.resumed = False

    def _lock(self, f, dst) -> None:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise CheckpointError(f"{dst}: another run is writing it ({self.tmp})") from None
        self.journal = f

    def read_journal(self) -> tuple[dict | None, dict[int, dict]]:
        """The state line and the tasks done (a last line cut short is ignored)."""
        self.journal.seek(0)
        lines = self.journal.read().split(b"\n")
        state, done = None, {}
        for i, line in enumerate(lines):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if i == 0:
                state = entry
            elif isinstance(entry, dict) and "t" in entry:
                done[entry["t"]] = entry
        return state, done

    def append(self, *entries: dict) -> None:
        self.journal.seek(0, os.SEEK_END)
        self.journal.write(b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n"
                                    for e in entries))
        self.journal.flush()
        os.fsync(self.journal.fileno())

    def commit(self) -> None:
        self.journal.close()
        (self.tmp / _JOURNAL).unlink()
        super().commit()

    def discard(self) -> None:
        if self.journal is not None:
            self.journal.close()
        if not self.keep:
            super().discard()


# ---------------------------------------------------------------------------------------
# Tasks

@dataclass
class _Task:
    """One unit of work: item `item` (an index into the plan's items), its band of rows
    (None: the whole tensor) or its byte piece (copies), and where each output's bytes go
    in shard `path`: name -> (file offset, length), or None for an output written by the
    item's first task only (a shape that does not grow with the rows)."""

    tid: int
    item: int
    path: str
    rows: tuple[int, int] | None
    piece: tuple[int, int] | None
    places: dict

    def key(self) -> list:
        return [self.tid, self.item, os.path.basename(self.path), self.rows, self.piece,
                sorted(self.places.items())]


def _item_bands(it: _Item, chunk: int) -> list[tuple[int, int] | None]:
    """The bands the single-process run streams `it` in (cuquant/checkpoint/quantize.py,
    dequantize.py), or [None] where it is written whole."""
    fmt = it.fmt
    if isinstance(fmt, _Module):   # dequantize, an engine's module
        if fmt.kind == "awq":
            return [None]
        if fmt.kind == "packed":
            align = 8 if not fmt.symmetric else 1
        else:
            align = 128 if fmt.strategy == "block" else 1
        return list(_bands(fmt.n, fmt.k, align, chunk))
    if isinstance(fmt, EngineFormat):
        if fmt.codes == "awq":
            return [None]
        n, k = it.src.shape
        return list(_bands(n, k, fmt.row_align, chunk))
    if it.out_dtype is not None:   # dequantize, cuquant's own formats
        n, kq = it.src.shape
        return list(_bands(n, 2 * kq if fmt.grouped else kq, fmt.row_align, chunk))
    n, k = it.src.shape
    return list(_bands(n, k, fmt.row_align, chunk))


def _prefix_sizes(it: _Item, r: int) -> list[int]:
    """Bytes of each output of `it` that its first `r` rows make (the outputs the
    single-process run writes band after band: a band's bytes start there)."""
    fmt = it.fmt
    if isinstance(fmt, _Module) or it.out_dtype is not None:   # dequantize: one [n, k] output
        (spec,) = it.outputs
        rows = spec.shape[0]
        return [spec.size() // rows * r]
    n, k = it.src.shape
    if isinstance(fmt, EngineFormat):
        base = it.src.name[: -len("weight")]
        specs = [TensorSpec(*o) for o in fmt.outputs(base, r, k, it.src.dtype, it.group)]
    else:
        specs = [TensorSpec(it.outputs[0].name, fmt.code_dtype, fmt.codes_shape(r, k, it.group)),
                 TensorSpec(it.outputs[1].name, "F32", fmt.companion_shape(r, k, it.group))]
    return [s.size() for s in specs]


def _tasks(plan: list[list[_Item]], items: list[_Item], begins: dict, paths: list[str],
           chunk: int) -> list[_Task]:
    """Every task of the run, in the single-process run's order."""
    index = {id(it): i for i, it in enumerate(items)}
    out: list[_Task] = []
    for shard, path in zip(plan, paths):
        for it in shard:
            i = index[id(it)]
            names = [s.name for s in it.outputs]
            if it.fmt is None:
                n = it.src.nbytes
                (name,) = names
                for at in range(0, max(n, 1), COPY_PIECE):
                    size = min(COPY_PIECE, n - at)
                    out.append(_Task(len(out), i, path, None, (at, size),
                                     {name: (begins[name] + at, size)}))
                continue
            full = [s.size() for s in it.outputs]
            for j, rows in enumerate(_item_bands(it, chunk)):
                if rows is None:
                    places = {nm: (begins[nm], size) for nm, size in zip(names, full)}
                else:
                    r0, r1 = rows
                    lo, hi = _prefix_sizes(it, r0), _prefix_sizes(it, r1)
                    zero = _prefix_sizes(it, 0)
                    places = {}
                    for nm, a, b, z, f in zip(names, lo, hi, zero, full):
                        if z == f and z:     # grows not with the rows: the first band writes it
                            places[nm] = (begins[nm], f) if j == 0 else None
                        else:
                            places[nm] = (begins[nm] + a, b - a)
                    last = r1 == (it.fmt.n if isinstance(it.fmt, _Module) else it.src.shape[0])
                    if last and any(p is not None and p[0] + p[1] != begins[nm] + f
                                    for (nm, p), f in zip(places.items(), full)):
                        raise CheckpointError(f"tensor {it.src.name!r}: its bands do not fill "
                                              "its outputs; this format cannot run on a cluster")
                out.append(_Task(len(out), i, path, rows, None, places))
    return out


class _Writer:
    """What the single-process writer's `write` does, at a task's places in a shard made
    by the client: each output's bytes in order from its place, by ``os.pwrite``."""

    def __init__(self, path: str, places: dict):
        self.path = path
        self.places = places
        self.done = {name: 0 for name in places}
        self.fd = os.open(path, os.O_WRONLY)

    def write(self, name: str, data) -> None:
        place = self.places[name]
        if place is None:
            return
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        buf = memoryview(data).cast("B")
        at, size = place
        done = self.done[name]
        if done + len(buf) > size:
            raise SafetensorsError(f"{self.path}: tensor {name!r} gets {done + len(buf)} bytes "
                                   f"from one task, more than its {size}")
        while len(buf):
            n = os.pwrite(self.fd, buf, at + done)
            buf = buf[n:]
            done += n
        self.done[name] = done

    def finish(self) -> None:
        short = [n for n, p in self.places.items() if p is not None and self.done[n] != p[1]]
        if short:
            raise SafetensorsError(f"{self.path}: tensors left incomplete by a task: {short[:5]}")

    def close(self) -> None:
        os.close(self.fd)


class _Tally:
    """The progress a task reports: bytes of input it consumed."""

    def __init__(self):
        self.bytes = 0

    def advance(self, nbytes: int, name: str, finished: bool = False) -> None:
        self.bytes += nbytes


_OPEN = threading.local()  # a worker thread's open input checkpoint (its files stay open)


def _checkpoint(src: str, state: str) -> Checkpoint:
    held = getattr(_OPEN, "held", None)
    if held is None or held[0] != (src, state):
        if held is not None:
            held[1].close()
        _OPEN.held = ((src, state), open_checkpoint(src))
    return _OPEN.held[1]


def _execute(task: _Task, it: _Item, work, src: str, state: str) -> dict:
    """Run one task on a worker: returns the input bytes it consumed, and the item's
    record as the band left it (outputs, sizes, error sums). A refusal of the input comes
    back as ``{"error": ...}``: running it again would not change it."""
    try:
        return _execute_once(task, it, work, src, state)
    except (CheckpointError, SafetensorsError) as e:
        return {"t": task.tid, "error": e}


def _execute_once(task: _Task, it: _Item, work, src: str, state: str) -> dict:
    ck = _checkpoint(src, state)
    w = _Writer(task.path, task.places)
    try:
        tally = _Tally()
        if task.piece is not None:
            at, size = task.piece
            f = ck.file_of(it.src.name)
            step = 64 << 20
            for p in range(at, at + size, step):
                part = f.read_bytes(it.src.name, p, min(step, at + size - p))
                w.write(it.src.name, part)
                tally.advance(len(part), it.src.name)
        else:
            it = copy.copy(it)
            it.record = copy.copy(it.record)
            it.rows = task.rows
            work(it, ck, w, tally)
        w.finish()
    finally:
        w.close()
    r = it.record
    stats = None
    if task.piece is None and r.max_abs_err is not None:
        stats = [float(r.signal).hex(), float(r.noise).hex(), float(r.max_abs_err).hex()]
    return {"t": task.tid, "in": tally.bytes, "out": r.bytes_out, "o": list(r.outputs),
            "s": stats}


# ---------------------------------------------------------------------------------------
# The run

class _Runner:
    """`prepare` and `run` of cuquant/checkpoint/write.py, on the cluster."""

    def __init__(self, cluster: _Cluster, kwargs: dict):
        self.cluster = cluster
        self.backend = cluster.backend
        self.resume = bool(kwargs.get("resume"))
        self.src = os.path.abspath(kwargs["src"])
        skip = {"progress", "overwrite", "resume", "scheduler", "src", "dst", "device"}
        self.options = {k: (list(v) if isinstance(v, (tuple, list)) else v)
                        for k, v in sorted(kwargs.items()) if k not in skip}
        self.options["backend"] = self.backend.name
        self.chunk = kwargs.get("chunk_elements") or (GPU_CHUNK if self.backend.name == "cuda"
                                                      else CPU_CHUNK)
        self.items: list[_Item] = []

    def prepare(self, ck, items, src, dst, overwrite, max_bytes):
        plan = _shard(items, max_bytes)
        self.items = items
        extra = _other_files(ck.root, [dst])
        out = _ClusterOutput(Path(dst), overwrite, [ck.root or Path(src)], self.resume)
        if not out.resumed:
            with out:
                _check_space(out.dst, sum(it.out_bytes for it in items)
                             + sum(p.stat().st_size for p in extra))
        return plan, extra, out

    def run(self, plan, ck, out: _ClusterOutput, metadata_for, work, progress):
        import cuquant

        names = _shard_names(len(plan))
        paths = [str(out.tmp / fname) for fname in names]
        heads, sizes, begins = [], [], {}
        weight_map: dict[str, str] = {}
        total = 0
        for shard, fname in zip(plan, names):
            specs = [s for it in shard for s in it.outputs]
            placed = layout(specs)
            head = header_bytes(placed, metadata_for(shard))
            for spec, b, _ in placed:
                begins[spec.name] = len(head) + b
            heads.append(head)
            sizes.append(len(head) + (placed[-1][2] if placed else 0))
            for s in specs:
                weight_map[s.name] = fname
                total += s.size()
        chunk = self.chunk
        tasks = _tasks(plan, self.items, begins, paths, chunk)
        digest = hashlib.sha256(json.dumps(
            [self.options, cuquant.__version__, chunk, [t.key() for t in tasks],
             [hashlib.sha256(h).hexdigest() for h in heads]], default=str).encode()).hexdigest()
        inputs = [[os.path.abspath(f.path), os.stat(f.path).st_size, os.stat(f.path).st_mtime_ns]
                  for f in ck.files]
        state = {"cuquant": 1, "inputs": inputs, "plan": digest}
        done: dict[int, dict] = {}
        if out.resumed:
            old, done = out.read_journal()
            out.keep = True
            self._check_state(old, state, out)
            for path, size in zip(paths, sizes):
                if not os.path.isfile(path) or os.path.getsize(path) != size:
                    raise CheckpointError(f"cannot resume {out.dst}: its partial shard "
                                          f"{os.path.basename(path)} is missing or cut short")
            out.keep = False
            done = {t: e for t, e in done.items() if 0 <= t < len(tasks)}
        else:
            for path, head, size in zip(paths, heads, sizes):
                with open(path, "wb") as f:
                    f.write(head)
                    f.truncate(size)
                    f.flush()
                    os.fsync(f.fileno())
            out.append(state)

        per_item: dict[int, list[int]] = {}
        for t in tasks:
            per_item.setdefault(t.item, []).append(t.tid)
        results: dict[int, dict] = {}
        left = {i: len(tids) for i, tids in per_item.items()}

        def finish(entry: dict) -> None:
            t = tasks[entry["t"]]
            results[t.tid] = entry
            left[t.item] -= 1
            it = self.items[t.item]
            progress.advance(entry["in"], it.src.name, finished=left[t.item] == 0)
            if left[t.item] == 0:
                self._record(it, [results[tid] for tid in per_item[t.item]])

        for tid in sorted(done):
            finish(done[tid])
        todo = [t for t in tasks if t.tid not in done]
        if todo:
            try:
                self._submit(todo, work, state, digest, out, finish)
            finally:
                self._release_workers_host_memory()
        _sync(paths)
        return names, {"total_size": total}, weight_map

    def _submit(self, todo, work, state, digest, out, finish) -> None:
        from distributed import as_completed

        client = self.cluster.client
        token = uuid.uuid4().hex[:8]
        st = json.dumps(state["inputs"]) + digest
        todo_path = {t.tid: t.path for t in todo}
        futures = [client.submit(_execute, t, self.items[t.item], work, self.src, st,
                                 key=f"cuquant-{token}-{t.tid}", retries=_RETRIES, pure=False)
                   for t in todo]
        # A task is journaled as done once its bytes are on disk: the shards it wrote are
        # synced (from here: a local filesystem syncs every writer's pages, a network one
        # took them at the worker's close) before the journal lists it, a batch at a time.
        pending: list[dict] = []
        synced = time.monotonic()
        try:
            for _, entry in as_completed(futures, with_results=True):
                if "error" in entry:
                    raise entry["error"]
                pending.append(entry)
                finish(entry)
                if time.monotonic() - synced >= _SYNC_EVERY:
                    _sync({todo_path[e["t"]] for e in pending})
                    out.append(*pending)
                    pending, synced = [], time.monotonic()
        except BaseException:
            client.cancel(futures)
            raise
        _sync({todo_path[e["t"]] for e in pending})
        out.append(*pending)

    def _release_workers_host_memory(self) -> None:
        """The workers keep their page-locked pools between tasks; a run's end gives the
        memory back, as the single-process run does (the workers may serve other work)."""
        try:
            self.cluster.client.run(release_host_memory)
        except Exception:  # noqa: BLE001 - a worker gone or unreachable holds nothing now
            pass

    @staticmethod
    def _check_state(old, new, out) -> None:
        if not isinstance(old, dict) or old.get("cuquant") != new["cuquant"]:
            raise CheckpointError(f"cannot resume {out.dst}: its journal is unreadable")
        if old.get("inputs") != new["inputs"]:
            was = {p: (s, m) for p, s, m in old.get("inputs", [])}
            now = {p: (s, m) for p, s, m in new["inputs"]}
            diff = sorted(set(was.items()) ^ set(now.items()))
            which = os.path.basename(diff[0][0]) if diff else "?"
            raise CheckpointError(f"cannot resume {out.dst}: the input changed since the run "
                                  f"began ({which}: other files, sizes or modification times)")
        if old.get("plan") != new["plan"]:
            raise CheckpointError(f"cannot resume {out.dst}: the run began with other options "
                                  "(format, shard size, chunk, device or cuquant version)")

    @staticmethod
    def _record(it: _Item, entries: list[dict]) -> None:
        """The item's record from its tasks' results, error sums added in band order."""
        r = it.record
        if it.fmt is None:
            r.bytes_out = it.src.nbytes
            return
        r.bytes_out, r.outputs = entries[0]["out"], list(entries[0]["o"])
        if all(e["s"] is not None for e in entries):
            signal = noise = worst = 0.0
            for e in entries:
                a, b, m = (float.fromhex(x) for x in e["s"])
                signal += a
                noise += b
                worst = _worse(worst, m)
            r.signal, r.noise, r.max_abs_err = signal, noise, worst


def _sync(paths) -> None:
    for path in sorted(paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
