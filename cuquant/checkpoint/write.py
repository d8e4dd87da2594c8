"""Output: a temporary directory beside the destination, renamed when complete, and
the loop that writes the planned shards."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from .formats import _WEIGHT_SUFFIXES, CheckpointError, human_bytes
from .plan import _Item, _shard, _shard_names
from .read import Checkpoint
from .safetensors import SafetensorsWriter


class _Output:
    """Writes go to ``.NAME.partial-PID`` in the destination's parent; `commit` renames it
    to NAME (moving an existing NAME aside first, with overwrite), `discard` removes it."""

    def __init__(self, dst: Path, overwrite: bool, protect: Sequence[Path]):
        self.dst = Path(os.path.abspath(dst))
        for p in protect:
            p = Path(os.path.abspath(p))
            if self.dst == p or self.dst in p.parents:
                raise CheckpointError(f"{dst}: the output would replace the input {p}; choose "
                                      "another output path")
        if (self.dst.exists() or self.dst.is_symlink()) and not overwrite:
            raise CheckpointError(f"{dst}: already exists; pass --overwrite to replace it")
        self.overwrite = overwrite
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.dst.parent / f".{self.dst.name}.partial-{os.getpid()}"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()

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


def _run(plan: list[list[_Item]], ck: Checkpoint, out: _Output, metadata_for, work,
         progress) -> tuple[list[str], dict, dict[str, str]]:
    """Write every shard of the plan; returns the shard file names, the index metadata
    (``total_size``: bytes of tensor data, as the Hugging Face index counts them) and the
    weight map."""
    names = _shard_names(len(plan))
    weight_map: dict[str, str] = {}
    total = 0
    for shard, fname in zip(plan, names):
        specs = [s for it in shard for s in it.outputs]
        with SafetensorsWriter(out.tmp / fname, specs, metadata_for(shard)) as w:
            for it in shard:
                work(it, ck, w, progress)
                for s in it.outputs:
                    weight_map[s.name] = fname
                    total += s.size()
    return names, {"total_size": total}, weight_map


def _copy_raw(it: _Item, ck: Checkpoint, w: SafetensorsWriter, progress: _Progress) -> None:
    f = ck.file_of(it.src.name)
    step = 64 << 20
    n = it.src.nbytes
    for at in range(0, n, step):
        part = f.read_bytes(it.src.name, at, min(step, n - at))
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
