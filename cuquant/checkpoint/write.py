"""Output: a temporary directory beside the destination, renamed when complete, and
the loop that writes the planned shards."""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .formats import _WEIGHT_SUFFIXES, CheckpointError, human_bytes
from .plan import _Item, _shard, _shard_names
from .read import Checkpoint
from .safetensors import SafetensorsWriter


class _Output:
    """Writes go to ``.NAME.partial-PID`` in the destination's parent; `commit` renames it
    to NAME (moving an existing NAME aside first, with overwrite), `discard` removes it."""

    def __init__(self, dst: Path, overwrite: bool, protect: Sequence[Path]):
        self.dst = self.destination(dst, overwrite, protect)
        self.overwrite = overwrite
        self.tmp = self.dst.parent / f".{self.dst.name}.partial-{os.getpid()}"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()

    @staticmethod
    def destination(dst, overwrite: bool, protect: Sequence[Path]) -> Path:
        """`dst` made absolute, refused where it would replace an input or (without
        `overwrite`) exists; its parent is created."""
        path = Path(os.path.abspath(dst))
        for p in protect:
            p = Path(os.path.abspath(p))
            if path == p or path in p.parents:
                raise CheckpointError(f"{dst}: the output would replace the input {p}; choose "
                                      "another output path")
        if (path.exists() or path.is_symlink()) and not overwrite:
            raise CheckpointError(f"{dst}: already exists; pass --overwrite to replace it")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def commit(self) -> None:
        old = None
        if self.dst.exists() or self.dst.is_symlink():
            old = self.dst.parent / f".{self.dst.name}.old-{os.getpid()}"
            os.replace(self.dst, old)
        try:
            os.replace(self.tmp, self.dst)
        except BaseException:
            if old is not None:
                os.replace(old, self.dst)
            raise
        if old is not None:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # `with out:` discards the temporary output when the block raises (interrupts too).
    def __enter__(self) -> "_Output":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self.discard()
        return False


def _other_files(root: Path | None, skip_dirs: Sequence[Path]) -> list[Path]:
    """Files of the model directory other than weights and config.json (rewritten), e.g.
    tokenizer files and generation_config.json; hidden entries are left out."""
    if root is None:
        return []
    skip = {Path(os.path.abspath(p)) for p in skip_dirs}
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and Path(os.path.abspath(here / d)) not in skip)
        for fn in sorted(filenames):
            if fn.startswith(".") or fn.endswith(_WEIGHT_SUFFIXES):
                continue
            if here == root and fn == "config.json":
                continue
            out.append(here / fn)
    return out


def _check_space(dst: Path, needed: int) -> None:
    free = shutil.disk_usage(dst.parent).free
    if needed > free:
        raise CheckpointError(f"not enough disk space for {dst}: the output needs "
                              f"{human_bytes(needed)}, {human_bytes(free)} is free")


def _write_json(path: Path, data) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


class _Progress:
    """Counts tensors and bytes through a user callback
    ``progress(tensors_done, tensors_total, bytes_done, bytes_total, name)``."""

    def __init__(self, callback, tensors: int, nbytes: int):
        self.cb, self.tensors, self.nbytes = callback, tensors, nbytes
        self.done_t = self.done_b = 0

    def advance(self, nbytes: int, name: str, finished: bool = False) -> None:
        self.done_b += nbytes
        self.done_t += finished
        if self.cb is not None:
            self.cb(self.done_t, self.tensors, self.done_b, self.nbytes, name)


# A read of the input: ("rows", name, r0, r1) or ("bytes", name, offset, size).
Read = tuple[str, str, int, int]


class _PrefetchedFile:
    """What a work function sees of an input file: reads that the read-ahead thread has
    made already are handed over, any other read is made here."""

    def __init__(self, ahead: "_ReadAhead", name: str):
        self._ahead, self._file = ahead, ahead.ck.file_of(name)

    def read_rows(self, name: str, r0: int, r1: int):
        return self._ahead.take(("rows", name, r0, r1), self._file)

    def read_bytes(self, name: str, offset: int = 0, size: int | None = None):
        size = self._file.tensors[name].nbytes - offset if size is None else size
        return self._ahead.take(("bytes", name, offset, size), self._file)

    def __getattr__(self, attr):
        return getattr(self._file, attr)


class _ReadAhead:
    """The input reads of a shard, in the order the work makes them, done `depth` reads
    ahead on `threads` threads (positional reads, so several bands are read at once): the
    disk (or the page cache) is read while the device computes and the previous output is
    written. Stands in for the Checkpoint in the work functions."""

    def __init__(self, ck: Checkpoint, reads: Iterable[Read], alloc, depth: int = 3,
                 threads: int = 2):
        self.ck, self._alloc = ck, alloc
        self._reads = iter(reads)
        self._pending: deque = deque()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="cuquant-read")
        for _ in range(depth):
            self._submit()

    def _submit(self) -> None:
        r = next(self._reads, None)
        if r is not None:
            self._pending.append((r, self._pool.submit(self._read, r)))

    def _read(self, r: Read):
        kind, name, a, b = r
        f = self.ck.file_of(name)
        return f.read_rows(name, a, b, self._alloc) if kind == "rows" else f.read_bytes(name, a, b)

    def take(self, r: Read, f):
        if self._pending and self._pending[0][0] == r:
            _, fut = self._pending.popleft()
            self._submit()
            return fut.result()
        # Not the read planned next: the plan and the work disagree, which costs the
        # overlap, never the bytes. One reader at a time on the file.
        for _, fut in self._pending:
            fut.result()
        kind, name, a, b = r
        return f.read_rows(name, a, b) if kind == "rows" else f.read_bytes(name, a, b)

    def file_of(self, name: str) -> _PrefetchedFile:
        return _PrefetchedFile(self, name)

    def __getattr__(self, attr):
        return getattr(self.ck, attr)

    def close(self) -> None:
        for _, fut in self._pending:
            fut.cancel()
        self._pool.shutdown(wait=True)


class _WriteBehind:
    """A SafetensorsWriter whose writes are made on a thread, in order, a few behind the
    work, so the next band is computed while this one is written. A failed write is
    raised at the next write or at `drain`."""

    def __init__(self, w: SafetensorsWriter, depth: int = 3):
        self._w = w
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="cuquant-write", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            if self._error is None:
                try:
                    self._w.write(*job)
                except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                    self._error = e

    def write(self, name: str, data) -> None:
        if self._error is not None:
            raise self._error
        self._q.put((name, data))

    def drain(self) -> None:
        """Wait for every write; raise the first that failed."""
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


def _run(plan: list[list[_Item]], ck: Checkpoint, out: _Output, metadata_for, work,
         progress, reads: Callable[[_Item], Iterable[Read]] | None = None,
         alloc=None) -> tuple[list[str], dict, dict[str, str]]:
    """Write every shard of the plan; returns the shard file names, the index metadata
    (``total_size``: bytes of tensor data, as the Hugging Face index counts them) and the
    weight map. `reads(item)` lists the input reads `work` makes for an item, in order:
    they are then made ahead, on a thread, rows into ``alloc(shape, dtype)``."""
    names = _shard_names(len(plan))
    weight_map: dict[str, str] = {}
    total = 0
    for shard, fname in zip(plan, names):
        specs = [s for it in shard for s in it.outputs]
        src = ck if reads is None else _ReadAhead(ck, (r for it in shard for r in reads(it)),
                                                  alloc or np.empty)
        try:
            with SafetensorsWriter(out.tmp / fname, specs, metadata_for(shard)) as w0:
                w = _WriteBehind(w0)
                try:
                    for it in shard:
                        work(it, src, w, progress)
                        for s in it.outputs:
                            weight_map[s.name] = fname
                            total += s.size()
                finally:
                    w.drain()
        finally:
            if src is not ck:
                src.close()
    return names, {"total_size": total}, weight_map


def _copy_reads(it: _Item) -> list[Read]:
    n = it.src.nbytes
    return [("bytes", it.src.name, at, min(_COPY_STEP, n - at)) for at in range(0, n, _COPY_STEP)]


_COPY_STEP = 64 << 20


def _copy_raw(it: _Item, ck: Checkpoint, w: SafetensorsWriter, progress: _Progress) -> None:
    f = ck.file_of(it.src.name)
    n = it.src.nbytes
    for at in range(0, n, _COPY_STEP):
        part = f.read_bytes(it.src.name, at, min(_COPY_STEP, n - at))
        w.write(it.src.name, part)
        progress.advance(len(part), it.src.name)
    it.record.bytes_out = n
    progress.advance(0, it.src.name, finished=True)


def _bands(n: int, k: int, align: int, chunk: int, only: tuple[int, int] | None = None):
    """Bands of rows [r0, r1); with `only`, that band alone (it must be one of them)."""
    rows = max(align, (chunk // max(k, 1)) // align * align)
    if only is not None:
        r0, r1 = only
        if r0 % rows or r1 != min(n, r0 + rows) or r0 >= n:
            raise ValueError(f"rows {r0}:{r1} are not a band of {n} rows by {rows}")
        yield r0, r1
        return
    for r0 in range(0, n, rows):
        yield r0, min(n, r0 + rows)


def _prepare(ck, items, src, dst, overwrite, max_bytes):
    """Shards, the other files to copy, and the temporary output (checked for space)."""
    plan = _shard(items, max_bytes)
    extra = _other_files(ck.root, [dst])
    out = _Output(Path(dst), overwrite, [ck.root or Path(src)])
    with out:
        _check_space(out.dst, sum(it.out_bytes for it in items)
                     + sum(p.stat().st_size for p in extra))
    return plan, extra, out


def _finish(out, ck, report, names, index_meta, wmap, cfg, extra) -> None:
    """Write the index, the config (when the input had one) and the other files, then
    move the finished output to its final name."""
    _write_json(out.tmp / "model.safetensors.index.json",
                {"metadata": index_meta, "weight_map": wmap})
    report.shards = names
    if cfg is not None:
        _write_json(out.tmp / "config.json", cfg)
        report.files_copied.append("config.json")
    report.files_copied += _copy_files(extra, ck.root, out.tmp)
    out.commit()


def _copy_files(files: list[Path], root: Path | None, dest: Path) -> list[str]:
    out = []
    for p in files:
        rel = p.relative_to(root)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, target)  # follows links (hub caches hold symlinks to blobs)
        out.append(rel.as_posix())
    return out
