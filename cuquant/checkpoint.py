"""Quantize and dequantize whole model checkpoints (safetensors), one tensor at a time.

`quantize_checkpoint` reads a checkpoint (one ``.safetensors`` file, a directory of shards,
or a ``*.safetensors.index.json``), quantizes its 2-D weight matrices with the library's
operators and writes shards plus an index; `dequantize_checkpoint` undoes it;
`inspect_checkpoint` lists what a checkpoint holds. Tensors stream through in bands of
rows, so host memory stays near one band, never one model. The output is written under a
temporary name beside its final one and renamed only when complete.

The command writes the formats inference engines load (`COMMAND_FORMATS`): the
compressed-tensors schemes and AWQ of `ENGINE_FORMATS` (cuquant/_engine_formats.py), and
DeepSeek-V3's fp8-block. `FORMATS` holds cuquant's own layouts: fp8-block, and the
formats no engine loads (int8-channel, int4-group, fp8-row), which Python callers may still
write (``quant_method: "cuquant"``) and which `dequantize_checkpoint` and
`inspect_checkpoint` still read. Each entry of `FORMATS` names the library functions that
quantize and dequantize it, and the tensors it writes for a weight ``W``: the codes under
the weight's own name, and one float32 companion (the scale, or DeepSpeed's params) under
``W + suffix``.

`dequantize_checkpoint` and `inspect_checkpoint` also read compressed-tensors and AWQ
checkpoints made by other tools (llm-compressor, AutoAWQ), from config.json's
``quantization_config``.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._engine_formats import (
    AWQ_ORDER,
    ENGINE_FORMATS,
    EngineFormat,
    awq_pack,
    awq_quantization_config,
    awq_unpack,
    bytes_of_words,
    ct_quantization_config,
    nibbles,
    pack_nibbles,
    pack_rows_4bit,
    unpack_rows_4bit,
    words_of_bytes,
)
from ._safetensors import (
    SafetensorsError,
    SafetensorsFile,
    SafetensorsWriter,
    TensorInfo,
    TensorSpec,
    load_file,
    numpy_dtype,
    save_file,
)

# The safetensors reader and writer are re-exported here: they read F8_E4M3 tensors as
# ml_dtypes.float8_e4m3fn arrays, which the safetensors package's NumPy API cannot.
__all__ = [
    "AWQ_ORDER",
    "COMMAND_FORMATS",
    "DEFAULT_SKIP",
    "ENGINE_FORMATS",
    "EngineFormat",
    "FORMATS",
    "SCALE_FORMATS",
    "Backend",
    "Checkpoint",
    "CheckpointError",
    "Format",
    "Report",
    "SafetensorsError",
    "SafetensorsFile",
    "TensorRecord",
    "ceil_pow2",
    "dequantize_checkpoint",
    "gpu_available",
    "human_bytes",
    "inspect_checkpoint",
    "load_file",
    "open_checkpoint",
    "parse_size",
    "quantize_checkpoint",
    "recognise",
    "save_file",
    "select_backend",
]


class CheckpointError(Exception):
    """A problem with the user's input or output (shown as one line, no traceback)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# The formats

@dataclass(frozen=True)
class Format:
    """One checkpoint format.

    Attributes
    ----------
    name : str
        As given to ``--format``.
    about : str
        One line for help texts and tables.
    quantize_fn, dequantize_fn : str
        The cuquant functions that make and undo it.
    code_dtype : str
        safetensors dtype of the codes, stored under the weight's own name.
    suffix : str
        The companion float32 tensor (scale or params) is stored as ``name + suffix``.
    codes_shape, companion_shape : callable (n, k, g) -> tuple
        Shapes written for a weight [n, k] (g: the group size, where there is one).
    companion_rows : callable (r0, r1, n, k, g) -> (s0, s1)
        The companion's first-axis slice that goes with rows r0:r1 of the weight.
    row_align : int
        Bands of rows start at multiples of this (the block height for tiles).
    grouped : bool
        Whether the functions take ``group_size``.
    """

    name: str
    about: str
    quantize_fn: str
    dequantize_fn: str
    code_dtype: str
    suffix: str
    codes_shape: Callable[[int, int, int], tuple]
    companion_shape: Callable[[int, int, int], tuple]
    companion_rows: Callable[[int, int, int, int, int], tuple]
    row_align: int = 1
    grouped: bool = False

    def function(self, which: str):
        import cuquant

        fn = getattr(cuquant, self.quantize_fn if which == "quantize" else self.dequantize_fn,
                     None)
        if fn is None:
            name = self.quantize_fn if which == "quantize" else self.dequantize_fn
            raise CheckpointError(f"format {self.name} needs cuquant.{name}, which this "
                                  f"version of cuquant ({cuquant.__version__}) does not have")
        return fn

    def available(self) -> bool:
        import cuquant

        return hasattr(cuquant, self.quantize_fn) and hasattr(cuquant, self.dequantize_fn)

    def unfit(self, n: int, k: int, g: int) -> str | None:
        """Why a weight [n, k] cannot take this format, or None."""
        if self.grouped and (k % g or k % 2):
            return f"K={k} is not a multiple of the group size {g}"
        return None


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp8-block", "float8_e4m3fn, one float32 scale per 128x128 tile (DeepSeek-V3)",
           "quantize_fp8_per_block", "dequantize_fp8_per_block", "F8_E4M3", "_scale_inv",
           codes_shape=lambda n, k, g: (n, k),
           companion_shape=lambda n, k, g: (_cdiv(n, 128), _cdiv(k, 128)),
           companion_rows=lambda r0, r1, n, k, g: (r0 // 128, _cdiv(r1, 128)),
           row_align=128),
    Format("int8-channel", "int8, one float32 scale per output channel (row)",
           "quantize_int8_per_channel", "dequantize_int8_per_channel", "I8", "_scale",
           codes_shape=lambda n, k, g: (n, k),
           companion_shape=lambda n, k, g: (n,),
           companion_rows=lambda r0, r1, n, k, g: (r0, r1)),
    Format("int4-group", "int4 two per byte, float32 (inverse multiplier, offset) per group",
           "quantize_int4_per_group", "dequantize_int4_per_group", "I8", "_params",
           codes_shape=lambda n, k, g: (n, k // 2),
           companion_shape=lambda n, k, g: (n * k // g, 2),
           companion_rows=lambda r0, r1, n, k, g: (r0 * k // g, r1 * k // g),
           grouped=True),
    Format("fp8-row", "float8_e4m3fn, one float32 scale per row",
           "quantize_fp8_per_row", "dequantize_fp8_per_row", "F8_E4M3", "_scale",
           codes_shape=lambda n, k, g: (n, k),
           companion_shape=lambda n, k, g: (n,),
           companion_rows=lambda r0, r1, n, k, g: (r0, r1)),
)}

# What `cuquant quantize` writes: the formats engines load.
COMMAND_FORMATS = (*ENGINE_FORMATS, "fp8-block")
# The formats no engine loads: written from Python only, read by dequantize and inspect.
LEGACY_FORMATS = ("int8-channel", "int4-group", "fp8-row")

SCALE_FORMATS = ("float32", "ue8m0")
FLOAT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
_ST_OF_FLOAT = {v: k for k, v in FLOAT_DTYPES.items()}

# Kept in high precision unless --no-default-skip: matched against whole tensor names
# (fnmatch, case-sensitive). Embeddings, the output head, norms and MoE routers. The router
# pattern names the module exactly: "*.gate.weight" catches mlp.gate but not mlp.gate_proj.
DEFAULT_SKIP = (
    "*embed*", "wte.*", "*.wte.*", "wpe.*", "*.wpe.*",
    "lm_head.*", "*.lm_head.*",
    "*norm*",
    "*.gate.weight", "*router*", "*shared_expert_gate*",
    "*.bias",
)
# Skipped 2-D weights that are not Linear layers (so not listed as ignored layers).
_EMBEDDINGS = ("*embed*", "wte.*", "*.wte.*", "wpe.*", "*.wpe.*")

# Files of a model directory that are weights in some other form: never copied.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
                    ".gguf", ".index.json")

CPU_CHUNK = 1 << 22  # elements per band of rows: the NumPy backend's temporaries stay ~100 MB
GPU_CHUNK = 1 << 27


def parse_size(text) -> int:
    """Bytes from "5GB", "500MB", "2GiB", "1e9" or an int (decimal units are powers of 1000)."""
    if isinstance(text, (int, np.integer)):
        return int(text)
    s = str(text).strip().upper().replace(" ", "")
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "K": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12, "B": 1}
    for unit in sorted(units, key=len, reverse=True):
        if s.endswith(unit):
            num, mult = s[: -len(unit)], units[unit]
            break
    else:
        num, mult = s, 1
    try:
        value = float(num) * mult
    except ValueError:
        raise CheckpointError(f"cannot read {text!r} as a size (try 5GB, 500MB, 2GiB)") from None
    if value <= 0 or not math.isfinite(value):
        raise CheckpointError(f"size must be positive; got {text!r}")
    return int(value)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ---------------------------------------------------------------------------------------
# Where the work runs

class Backend:
    """NumPy on the host, or CuPy on a CUDA device: moving bands of rows there and back,
    and the error statistics."""

    def __init__(self, name: str, xp):
        self.name = name
        self.xp = xp

    def to_device(self, host: np.ndarray):
        if self.xp is np:
            return host
        if host.dtype.itemsize == 1 and host.dtype.kind not in "iub":
            host = host.view(np.uint8)  # float8: CuPy holds the codes as uint8
        return self.xp.asarray(host)

    def to_host(self, a) -> np.ndarray:
        return a if isinstance(a, np.ndarray) else a.get()

    def error_terms(self, w, deq) -> tuple[float, float, float]:
        """(sum w^2, sum (deq - w)^2, max |deq - w|) over a band, in float32 math."""
        xp = self.xp
        w32 = w.astype(xp.float32).reshape(-1)
        e = deq.astype(xp.float32).reshape(-1) - w32
        if e.size == 0:
            return 0.0, 0.0, 0.0
        return float(xp.dot(w32, w32)), float(xp.dot(e, e)), float(xp.abs(e).max())


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean no GPU
        return False


def select_backend(device: str = "auto") -> Backend:
    """``"cuda"`` (CuPy kernels), ``"cpu"`` (the NumPy backend) or ``"auto"``: the GPU
    when there is one."""
    if device not in ("auto", "cpu", "cuda"):
        raise CheckpointError(f"device must be auto, cpu or cuda; got {device!r}")
    if device == "cpu" or (device == "auto" and not gpu_available()):
        return Backend("cpu", np)
    if not gpu_available():
        raise CheckpointError("--device cuda: no CUDA device is usable here (CuPy missing, no "
                              "driver, or no GPU); use --device cpu")
    import cupy

    return Backend("cuda", cupy)


# ---------------------------------------------------------------------------------------
# Reading a checkpoint

@dataclass
class Checkpoint:
    """An opened input checkpoint.

    Attributes
    ----------
    root : Path or None
        The model directory whose other files (config, tokenizer) go with the weights;
        None when a lone ``.safetensors`` file was given.
    files : list of SafetensorsFile
    tensors : dict name -> TensorInfo (over every shard)
    config : dict or None
        ``config.json`` of the model directory.
    """

    root: Path | None
    files: list[SafetensorsFile]
    tensors: dict[str, TensorInfo]
    config: dict | None
    _by_path: dict[str, SafetensorsFile] = field(default_factory=dict)

    def file_of(self, name: str) -> SafetensorsFile:
        return self._by_path[self.tensors[name].path]

    def metadata_of(self, name: str) -> dict[str, str]:
        return self.file_of(name).metadata

    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _read_json(path: Path, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: corrupt {what}: not valid JSON ({e})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: corrupt {what}: not UTF-8 text") from None


def _shard_paths(path: Path) -> tuple[Path | None, list[Path]]:
    """(model directory, shard files) for a file, a directory or an index."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if path.is_dir():
        indexes = sorted(path.glob("*.safetensors.index.json"))
        if len(indexes) > 1:
            named = [p for p in indexes if p.name == "model.safetensors.index.json"]
            indexes = named or indexes[:1]
        if indexes:
            return _shard_paths_from_index(indexes[0])
        shards = sorted(p for p in path.glob("*.safetensors") if p.is_file())
        if not shards:
            raise CheckpointError(f"{path}: no .safetensors files (and no index) in this directory")
        return path, shards
    if path.name.endswith(".json"):
        return _shard_paths_from_index(path)
    return None, [path]


def _shard_paths_from_index(index: Path) -> tuple[Path, list[Path]]:
    data = _read_json(index, "index")
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise CheckpointError(f"{index}: corrupt index: no weight_map of tensor names to files")
    files = []
    for name in dict.fromkeys(wmap.values()):
        p = index.parent / name
        if not p.is_file():
            raise CheckpointError(f"{index}: lists shard {name}, which is missing")
        files.append(p)
    if not files:
        raise CheckpointError(f"{index}: the weight_map is empty")
    return index.parent, files


def open_checkpoint(path) -> Checkpoint:
    """Open a checkpoint: one ``.safetensors`` file, a directory holding shards (and
    perhaps an index), or an index file. Headers are read and checked; no data is read.

    Raises
    ------
    CheckpointError
        Missing paths, a corrupt index, a tensor name held by two shards.
    SafetensorsError
        A truncated or corrupt shard.
    """
    root, paths = _shard_paths(Path(path))
    files: list[SafetensorsFile] = []
    tensors: dict[str, TensorInfo] = {}
    by_path: dict[str, SafetensorsFile] = {}
    try:
        for p in paths:
            f = SafetensorsFile(p)
            files.append(f)
            by_path[f.path] = f
            for name, info in f.tensors.items():
                if name in tensors:
                    raise CheckpointError(f"tensor {name!r} is in two shards: "
                                          f"{tensors[name].path} and {p}")
                tensors[name] = info
        config = None
        if root is not None and (root / "config.json").is_file():
            config = _read_json(root / "config.json", "config.json")
            if not isinstance(config, dict):
                raise CheckpointError(f"{root / 'config.json'}: corrupt config.json: not a "
                                      "JSON object")
    except BaseException:
        for f in files:
            f.close()
        raise
    return Checkpoint(root, files, tensors, config, by_path)


def recognise(ck: Checkpoint, name: str) -> tuple[Format, int] | None:
    """(format, group size) when tensor `name` holds codes whose companion is present."""
    info = ck.tensors[name]
    if len(info.shape) != 2:
        return None
    n, kq = info.shape
    for fmt in FORMATS.values():
        comp = ck.tensors.get(name + fmt.suffix)
        if fmt.code_dtype != info.dtype or comp is None or comp.dtype != "F32":
            continue
        if fmt.grouped:
            k = 2 * kq
            rows = comp.shape[0] if len(comp.shape) == 2 else 0
            if len(comp.shape) != 2 or comp.shape[1] != 2 or rows == 0 or (n * k) % rows:
                continue
            g = n * k // rows
            if k % g:
                continue
            meta = ck.metadata_of(name).get("cuquant.group_size")
            if meta is not None and meta.isdigit() and int(meta) != g:
                continue
        else:
            k, g = kq, 0
        if tuple(comp.shape) == fmt.companion_shape(n, k, g) and fmt.codes_shape(n, k, g) == (n, kq):
            return fmt, g
    return None


# ---------------------------------------------------------------------------------------
# Reports

@dataclass
class TensorRecord:
    """What became of one input tensor."""

    name: str
    action: str  # "quantized", "kept" or "dequantized"
    reason: str
    dtype: str
    shape: tuple
    bytes_in: int
    bytes_out: int = 0
    format: str | None = None
    outputs: list[str] = field(default_factory=list)
    signal: float = 0.0  # sum of w^2, for the SQNR
    noise: float = 0.0  # sum of (dequantized - w)^2
    max_abs_err: float | None = None

    @property
    def sqnr_db(self) -> float | None:
        return _sqnr(self.signal, self.noise)

    def to_json(self) -> dict:
        d = {"name": self.name, "action": self.action, "reason": self.reason,
             "dtype": self.dtype, "shape": list(self.shape), "bytes_in": self.bytes_in,
             "bytes_out": self.bytes_out, "format": self.format, "outputs": self.outputs}
        if self.action == "quantized" and self.max_abs_err is not None:
            d["sqnr_db"] = _finite_or_none(self.sqnr_db)
            d["max_abs_err"] = _finite_or_none(self.max_abs_err)
        return d


def _sqnr(signal: float, noise: float) -> float | None:
    """10 log10(signal / noise); inf for an exact result; None when undefined."""
    if not (math.isfinite(signal) and math.isfinite(noise)) or signal <= 0:
        return None
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def _worse(a: float | None, b: float) -> float:
    """The larger error; a NaN (from NaN weights) sticks."""
    if a is None:
        return b
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


def _finite_or_none(x):
    return x if x is not None and math.isfinite(x) else None


@dataclass
class Report:
    """The outcome of one command: every tensor's record plus totals.

    `groups()` sums the records by what they became (each format, or "high precision");
    `to_json()` is what ``--report`` writes.
    """

    command: str
    source: str
    output: str
    format: str | None
    device: str
    options: dict
    records: list[TensorRecord] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    files_copied: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stats: bool = True

    @property
    def bytes_in(self) -> int:
        return sum(r.bytes_in for r in self.records)

    @property
    def bytes_out(self) -> int:
        return sum(r.bytes_out for r in self.records)

    def count(self, action: str) -> int:
        return sum(r.action == action for r in self.records)

    def groups(self) -> list[dict]:
        """Rows by what each tensor became, in a stable order."""
        out: dict[str, dict] = {}
        for r in self.records:
            key = r.format if r.action in ("quantized", "dequantized") else "high precision"
            g = out.setdefault(key, {"group": key, "tensors": 0, "bytes_in": 0, "bytes_out": 0,
                                     "signal": 0.0, "noise": 0.0, "max_abs_err": None,
                                     "worst_sqnr_db": None, "errors": False})
            g["tensors"] += 1
            g["bytes_in"] += r.bytes_in
            g["bytes_out"] += r.bytes_out
            if r.action == "quantized" and r.max_abs_err is not None:
                g["errors"] = True
                g["signal"] += r.signal
                g["noise"] += r.noise
                g["max_abs_err"] = _worse(g["max_abs_err"], r.max_abs_err)
                s = r.sqnr_db
                if s is not None and (g["worst_sqnr_db"] is None or s < g["worst_sqnr_db"]):
                    g["worst_sqnr_db"] = s
        rows = []
        for g in out.values():
            g["sqnr_db"] = _sqnr(g.pop("signal"), g.pop("noise")) if g["errors"] else None
            del g["errors"]
            rows.append(g)
        rows.sort(key=lambda g: (g["group"] == "high precision", g["group"]))
        return rows

    def to_json(self) -> dict:
        import cuquant

        groups = []
        for g in self.groups():
            g = dict(g)
            for k in ("sqnr_db", "worst_sqnr_db", "max_abs_err"):
                g[k] = _finite_or_none(g[k])
            groups.append(g)
        return {
            "cuquant_version": cuquant.__version__, "command": self.command,
            "source": self.source, "output": self.output, "format": self.format,
            "device": self.device, "options": self.options, "seconds": round(self.seconds, 3),
            "summary": {"tensors": len(self.records), "quantized": self.count("quantized"),
                        "dequantized": self.count("dequantized"), "kept": self.count("kept"),
                        "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                        "shards": self.shards, "files_copied": self.files_copied},
            "groups": groups, "warnings": self.warnings,
            "tensors": [r.to_json() for r in self.records],
        }


# ---------------------------------------------------------------------------------------
# The plan: what each input tensor becomes, and which output shard it lands in

@dataclass
class _Item:
    record: TensorRecord
    src: TensorInfo
    outputs: list[TensorSpec]
    fmt: Format | None = None
    group: int = 0
    companion: TensorInfo | None = None  # dequantize: the scale / params read beside
    out_dtype: str | None = None  # dequantize: the float type restored

    @property
    def out_bytes(self) -> int:
        return sum(s.size() for s in self.outputs)


def _matches(name: str, patterns: Sequence[str]) -> str | None:
    for p in patterns:
        if fnmatch.fnmatchcase(name, p):
            return p
    return None


def _decide(info: TensorInfo, fmt, skip: Sequence[str], group: int) -> str | None:
    """Why tensor `info` stays in high precision, or None to quantize it."""
    if info.dtype not in FLOAT_DTYPES:
        return f"dtype {info.dtype}"
    if len(info.shape) != 2:
        return f"{len(info.shape)}-D"
    if not (info.name == "weight" or info.name.endswith(".weight")):
        return "not a .weight"
    n, k = info.shape
    if n == 0 or k == 0:
        return "empty"
    hit = _matches(info.name, skip)
    if hit:
        return f"matches {hit!r}"
    if isinstance(fmt, EngineFormat):
        return fmt.unfit(n, k, info.dtype, group)
    return fmt.unfit(n, k, group)


def _shard(items: list[_Item], max_bytes: int) -> list[list[_Item]]:
    """Greedy packing in input order; an item's tensors never split across shards."""
    shards: list[list[_Item]] = [[]]
    size = 0
    for it in items:
        b = it.out_bytes
        if shards[-1] and size + b > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += b
    return shards if shards[0] else []


def _shard_names(count: int) -> list[str]:
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


# ---------------------------------------------------------------------------------------
# Output: a temporary directory beside the destination, renamed when complete

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


def _bands(n: int, k: int, align: int, chunk: int):
    rows = max(align, (chunk // max(k, 1)) // align * align)
    for r0 in range(0, n, rows):
        yield r0, min(n, r0 + rows)


# ---------------------------------------------------------------------------------------
# UE8M0 scales for the block format

def ceil_pow2(s: np.ndarray) -> np.ndarray:
    """The smallest power of two >= each float32 value (exact, from the float's own bits
    through float64, where every float32 is exact); NaN and inf stay."""
    s = np.asarray(s, dtype=np.float32)
    m, e = np.frexp(s.astype(np.float64))
    p = np.where(m == 0.5, s.astype(np.float64), np.ldexp(1.0, e))
    return np.where(np.isfinite(s) & (s > 0), p, s).astype(np.float32)


# ---------------------------------------------------------------------------------------
# quantize

def quantize_checkpoint(src, dst, format: str, *, skip: Sequence[str] = (),
                        default_skip: bool = True, scale_format: str = "float32",
                        group_size: int = 128, device: str = "auto",
                        max_shard_size="5GB", overwrite: bool = False, stats: bool = True,
                        progress=None, chunk_elements: int | None = None) -> Report:
    """Quantize the 2-D weight matrices of a safetensors checkpoint.

    Parameters
    ----------
    src : path
        A ``.safetensors`` file, a directory of shards, or a ``*.safetensors.index.json``.
    dst : path
        The output directory (refused when it exists, unless `overwrite`).
    format : str
        One of `COMMAND_FORMATS` ("W8A8", "FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "W8A16",
        "AWQ", "fp8-block"), which engines load; or "int8-channel", "int4-group",
        "fp8-row", cuquant's own layouts, which no engine loads (``quant_method:
        "cuquant"``).
    skip : sequence of str
        Glob patterns of tensor names to keep in high precision, on top of `DEFAULT_SKIP`
        (unless `default_skip` is False). Tensors that are not 2-D float ``.weight``
        matrices are always kept.
    scale_format : {"float32", "ue8m0"}
        fp8-block only: "ue8m0" rounds every tile scale up to a power of two.
    group_size : int
        W4A16, W4A16_ASYM, W8A16, AWQ and int4-group: elements per group along a row (a
        weight whose K is not a multiple stays in high precision, listed as ignored).
    device : {"auto", "cpu", "cuda"}
    max_shard_size : int or str
        Output shards are cut before they exceed this ("5GB" by default).
    overwrite : bool
    stats : bool
        Measure the quantization error (SQNR, max abs error) of every tensor.
    progress : callable, optional
        ``progress(tensors_done, tensors_total, bytes_done, bytes_total, name)``.
    chunk_elements : int, optional
        Elements per band of rows streamed through the quantizer.

    Returns
    -------
    Report
    """
    import cuquant

    t0 = time.perf_counter()
    fmt = ENGINE_FORMATS.get(format) or FORMATS.get(format)
    if fmt is None:
        raise CheckpointError(f"unknown format {format!r}; choose one of "
                              f"{', '.join(COMMAND_FORMATS)}")
    engine = isinstance(fmt, EngineFormat)
    if scale_format not in SCALE_FORMATS:
        raise CheckpointError(f"unknown scale format {scale_format!r}; choose float32 or ue8m0")
    if scale_format != "float32" and fmt.name != "fp8-block":
        raise CheckpointError(f"--scale-format {scale_format} applies to fp8-block only")
    group = int(group_size) if fmt.grouped else 0
    if fmt.grouped and (group < 2 or group % 2):
        raise CheckpointError(f"group size must be an even number >= 2; got {group_size}")
    if engine and fmt.grouped and group % 8:
        raise CheckpointError(f"group size must be a multiple of 8 for {fmt.name}; got "
                              f"{group_size}")
    if not engine:
        fmt.function("quantize")
        fmt.function("dequantize")
    max_bytes = parse_size(max_shard_size)
    backend = select_backend(device)
    chunk = chunk_elements or (GPU_CHUNK if backend.name == "cuda" else CPU_CHUNK)
    patterns = (tuple(DEFAULT_SKIP) if default_skip else ()) + tuple(skip)

    with open_checkpoint(src) as ck:
        if ck.config is not None and "quantization_config" in ck.config:
            method = ck.config["quantization_config"].get("quant_method", "?") \
                if isinstance(ck.config["quantization_config"], dict) else "?"
            raise CheckpointError(f"{src}: already quantized (config.json has a "
                                  f"quantization_config, quant_method {method!r}); run "
                                  "`cuquant dequantize` on it first")
        items = []
        for name, info in ck.tensors.items():
            rec = TensorRecord(name, "kept", "", info.dtype, info.shape, info.nbytes)
            why = _decide(info, fmt, patterns, group)
            if why is None:
                n, k = info.shape
                rec.action, rec.reason, rec.format = "quantized", fmt.name, fmt.name
                if engine:
                    outs = [TensorSpec(*o) for o in
                            fmt.outputs(name[: -len("weight")], n, k, info.dtype, group)]
                else:
                    outs = [TensorSpec(name, fmt.code_dtype, fmt.codes_shape(n, k, group)),
                            TensorSpec(name + fmt.suffix, "F32",
                                       fmt.companion_shape(n, k, group))]
                items.append(_Item(rec, info, outs, fmt, group))
            else:
                rec.reason = why
                items.append(_Item(rec, info, [TensorSpec(name, info.dtype, info.shape,
                                                          info.nbytes)]))
        _check_names(items)
        report = Report("quantize", str(src), str(dst), fmt.name, backend.name,
                        {"skip": list(patterns), "scale_format": scale_format,
                         "group_size": group or None, "max_shard_size": max_bytes},
                        stats=stats)
        report.records = [it.record for it in items]
        report.warnings += _ignored_warnings(items)
        report.warnings += _unfit_warnings(items, fmt, group)
        plan, extra, out = _prepare(ck, items, src, dst, overwrite, max_bytes)
        with out:
            meta = {"format": "pt", "cuquant.format": fmt.name,
                    "cuquant.version": cuquant.__version__}
            if fmt.name == "fp8-block":
                meta["cuquant.block_size"] = "128,128"
                meta["cuquant.scale_format"] = scale_format
            if fmt.grouped:
                meta["cuquant.group_size"] = str(group)

            def metadata_for(shard):
                m = dict(meta)
                src_dtypes = {it.record.name: FLOAT_DTYPES[it.record.dtype]
                              for it in shard if it.fmt is not None}
                if len(set(src_dtypes.values())) == 1:
                    m["cuquant.source_dtype"] = next(iter(src_dtypes.values()))
                elif src_dtypes:
                    m["cuquant.source_dtypes"] = json.dumps(src_dtypes, separators=(",", ":"))
                return m

            prog = _Progress(progress, len(items), sum(it.src.nbytes for it in items))

            def work(it, ck, w, p):
                if it.fmt is None:
                    _copy_raw(it, ck, w, p)
                elif engine:
                    _quantize_engine(it, ck, w, p, backend, chunk, stats)
                else:
                    _quantize_one(it, ck, w, p, backend, scale_format, chunk, stats)

            names, index_meta, wmap = _run(plan, ck, out, metadata_for, work, prog)
            index_meta.update({"cuquant_format": fmt.name, "cuquant_version": cuquant.__version__})
            if fmt.grouped:
                index_meta["cuquant_group_size"] = group
            if fmt.name == "fp8-block":
                index_meta["cuquant_scale_format"] = scale_format
            cfg = None
            if ck.config is not None:
                cfg = dict(ck.config)
                cfg["quantization_config"] = _quantization_config(fmt, scale_format, group, items)
            _finish(out, ck, report, names, index_meta, wmap, cfg, extra)
    report.seconds = time.perf_counter() - t0
    return report


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


def _check_names(items: list[_Item]) -> None:
    seen: dict[str, str] = {}
    for it in items:
        for s in it.outputs:
            if s.name in seen:
                raise CheckpointError(f"output tensor {s.name!r} (from {it.src.name!r}) collides "
                                      f"with one from {seen[s.name]!r}")
            seen[s.name] = it.src.name


def _ignored_modules(items: list[_Item]) -> list[str]:
    """Modules of the 2-D weights left in high precision (Linear layers, as far as names
    tell: embeddings are left out)."""
    out = []
    for it in items:
        r = it.record
        if (r.action == "kept" and len(r.shape) == 2 and r.name.endswith(".weight")
                and r.dtype in FLOAT_DTYPES and not _matches(r.name, _EMBEDDINGS)):
            out.append(r.name[: -len(".weight")])
    return out


def _ignored_warnings(items: list[_Item]) -> list[str]:
    """transformers matches modules_to_not_convert entries as prefixes: an entry that
    prefixes a quantized module would keep that one unconverted too."""
    ignored = _ignored_modules(items)
    quantized = [it.record.name[: -len(".weight")] for it in items
                 if it.record.action == "quantized" and it.record.name.endswith(".weight")]
    warn = []
    for m in ignored:
        hit = next((q for q in quantized if q.startswith(m)), None)
        if hit is not None:
            warn.append(f"ignored layer {m!r} is a prefix of quantized layer {hit!r}: loaders "
                        "that match prefixes (transformers) would skip both")
    return warn


def _unfit_warnings(items: list[_Item], fmt, group: int) -> list[str]:
    """One line for each reason a weight the format could not take stays in high
    precision (it is listed in the config's ignore / modules_to_not_convert)."""
    if not isinstance(fmt, EngineFormat) and not fmt.grouped:
        return []
    by_reason: dict[str, list[str]] = {}
    for it in items:
        r = it.record
        if r.action != "kept" or len(r.shape) != 2 or r.dtype not in FLOAT_DTYPES:
            continue
        if not (r.name == "weight" or r.name.endswith(".weight")) or r.reason.startswith(
                ("matches", "empty", "not a")):
            continue
        by_reason.setdefault(r.reason, []).append(r.name)
    out = []
    for why, names in by_reason.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(f"kept {_plural(len(names), 'weight')} in high precision, listed as not "
                   f"converted ({why}): {shown}")
    return out


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _quantization_config(fmt, scale_format: str, group: int, items: list[_Item]) -> dict:
    import cuquant

    ignored = _ignored_modules(items)
    if isinstance(fmt, EngineFormat):
        # Loaders quantize every Linear a config group targets: a head tied to the
        # embeddings (no lm_head tensor) must be named too.
        quantized = {it.record.name for it in items if it.record.action == "quantized"}
        if "lm_head" not in ignored and not any(q.startswith("lm_head.") for q in quantized):
            ignored = [*ignored, "lm_head"]
        if fmt.method == "awq":
            return awq_quantization_config(group, ignored)
        return ct_quantization_config(fmt, group, ignored)
    if fmt.name == "fp8-block":
        qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [128, 128]}
        if scale_format == "ue8m0":
            qc["scale_fmt"] = "ue8m0"
    else:
        # No inference engine loads these as they are: a method name of our own keeps a
        # loader from mistaking the codes for weights.
        qc = {"quant_method": "cuquant", "format": fmt.name,
              "cuquant_version": cuquant.__version__}
        if fmt.grouped:
            qc["group_size"] = group
    qc["ignored_layers"] = list(ignored)
    qc["modules_to_not_convert"] = list(ignored)
    return qc


def _copy_files(files: list[Path], root: Path | None, dest: Path) -> list[str]:
    out = []
    for p in files:
        rel = p.relative_to(root)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, target)  # follows links (hub caches hold symlinks to blobs)
        out.append(rel.as_posix())
    return out


def _quantize_one(it: _Item, ck: Checkpoint, w: SafetensorsWriter, progress: _Progress,
                  backend: Backend, scale_format: str, chunk: int, stats: bool) -> None:
    fmt, g = it.fmt, it.group
    qfn, dfn = fmt.function("quantize"), fmt.function("dequantize")
    f = ck.file_of(it.src.name)
    n, k = it.src.shape
    codes_name, comp_name = it.outputs[0].name, it.outputs[1].name
    kw = {"group_size": g} if fmt.grouped else {}
    signal = noise = 0.0
    worst = 0.0
    for r0, r1 in _bands(n, k, fmt.row_align, chunk):
        host = f.read_rows(it.src.name, r0, r1)
        x = backend.to_device(host)
        if fmt.name == "fp8-block" and scale_format == "ue8m0":
            q, s = qfn(x, scale_format="ue8m0")
        else:
            q, s = qfn(x, **kw)
        w.write(codes_name, backend.to_host(q))
        w.write(comp_name, backend.to_host(s))
        if stats:
            deq = dfn(q, s, "float32", **kw)
            a, b, m = backend.error_terms(x, deq)
            signal += a
            noise += b
            worst = _worse(worst, m)
            del deq
        progress.advance(host.nbytes, it.src.name)
        del host, x, q, s
    it.record.bytes_out = it.out_bytes
    it.record.outputs = [codes_name, comp_name]
    if stats:
        it.record.signal, it.record.noise, it.record.max_abs_err = signal, noise, worst
    progress.advance(0, it.src.name, finished=True)


def _host_float(backend: Backend, a, dtype) -> np.ndarray:
    """A small device array (scales, zero points) on the host, converted there."""
    return np.asarray(backend.to_host(a)).astype(dtype)


def _quantize_engine(it: _Item, ck: Checkpoint, w: SafetensorsWriter, progress: _Progress,
                     backend: Backend, chunk: int, stats: bool) -> None:
    """One weight in a compressed-tensors or AWQ format: bands of rows through the
    library's quantizer, the codes repacked on the backend, the scales in the model dtype.
    AWQ stores the weight transposed ([K, N/8] words): its bands are gathered, then packed
    whole."""
    import cuquant

    fmt, g = it.fmt, it.group
    xp = backend.xp
    name = it.src.name
    f = ck.file_of(name)
    n, k = it.src.shape
    model_dt = FLOAT_DTYPES[it.src.dtype]
    out = {s.name[len(name) - len("weight"):]: s.name for s in it.outputs}
    signal = noise = 0.0
    worst = 0.0
    awq_codes, awq_scales, awq_zeros = [], [], []
    # Bands of the asymmetric format start at multiples of 8 rows: its zero points are
    # packed eight rows a word.
    align = 8 if fmt.codes == "packed" and not fmt.symmetric else 1
    for r0, r1 in _bands(n, k, align, chunk):
        host = f.read_rows(name, r0, r1)
        x = backend.to_device(host)
        if fmt.codes == "int8":
            q, sc = cuquant.quantize_int8_per_channel(x, scale_dtype=model_dt)
            s32 = _host_float(backend, sc, np.float32)
            w.write(out["weight"], backend.to_host(q))
            w.write(out["weight_scale"], backend.to_host(sc))
            deq = (cuquant.dequantize_int8_per_channel(q, backend.to_device(s32), "float32")
                   if stats else None)
        elif fmt.codes == "fp8":
            q, sc = cuquant.quantize_fp8_per_row(x, scale_dtype=model_dt)
            s32 = _host_float(backend, sc, np.float32)
            w.write(out["weight"], backend.to_host(q))
            w.write(out["weight_scale"], backend.to_host(sc))
            deq = (cuquant.dequantize_fp8_per_row(q, backend.to_device(s32), "float32")
                   if stats else None)
        else:
            src = x
            if fmt.codes == "awq":
                # AWQ's scales are float16: the weights are quantized as float16.
                # bfloat16 -> float32 is exact, float32 -> float16 one rounding (to nearest
                # even) on either backend.
                x32 = None if model_dt == "float16" else x.astype(xp.float32)
                src = x if x32 is None else x32.astype(xp.float16)
                if x32 is not None and bool(xp.any(xp.isinf(src) & ~xp.isinf(x32))):
                    raise CheckpointError(
                        f"tensor {name!r}: values beyond float16's range, which AWQ's float16 "
                        "scales cannot hold; keep it in high precision with --skip, or use "
                        "W4A16_ASYM")
                del x32
            q, sc, z, _ = cuquant.quantize_groupwise_zero_point(
                src, bits=fmt.bits, group_size=g, symmetric=fmt.symmetric)
            deq = (cuquant.dequantize_groupwise_zero_point(q, sc, z, g, "float32", bits=fmt.bits)
                   if stats else None)
            if fmt.codes == "awq":
                awq_codes.append(q)
                awq_scales.append(backend.to_host(sc))
                awq_zeros.append(_host_float(backend, z, np.float32).astype(np.uint8))
            else:
                # Codes q + 2**(bits-1) in little-endian int32 words: compressed-tensors' pack.
                w.write(out["weight_packed"], backend.to_host(words_of_bytes(xp, q)))
                w.write(out["weight_scale"], backend.to_host(sc))
                if not fmt.symmetric:
                    zu = _host_float(backend, z, np.float32).astype(np.uint8)
                    w.write(out["weight_zero_point"], pack_rows_4bit(np, zu))
        if stats:
            a, b, m = backend.error_terms(x, deq)
            signal += a
            noise += b
            worst = _worse(worst, m)
        progress.advance(host.nbytes, name)
        del host, x, deq
    if fmt.codes == "packed":
        w.write(out["weight_shape"], np.array([n, k], np.int64))
    if fmt.codes == "awq":
        codes = xp.concatenate(awq_codes) if len(awq_codes) > 1 else awq_codes[0]
        del awq_codes
        u = xp.ascontiguousarray(nibbles(xp, codes).T)          # [K, N]
        del codes
        w.write(out["qweight"], backend.to_host(awq_pack(xp, u)))
        del u
        zeros = np.ascontiguousarray(np.concatenate(awq_zeros).T)   # [K/G, N]
        w.write(out["qzeros"], awq_pack(np, zeros))
        w.write(out["scales"], np.ascontiguousarray(np.concatenate(awq_scales).T))
    it.record.bytes_out = it.out_bytes
    it.record.outputs = [s.name for s in it.outputs]
    if stats:
        it.record.signal, it.record.noise, it.record.max_abs_err = signal, noise, worst
    progress.advance(0, name, finished=True)


# ---------------------------------------------------------------------------------------
# dequantize

def dequantize_checkpoint(src, dst, *, dtype: str | None = None, device: str = "auto",
                          max_shard_size="5GB", overwrite: bool = False, progress=None,
                          chunk_elements: int | None = None) -> Report:
    """Restore a float checkpoint from a quantized one (any format of `FORMATS`, from
    cuquant or a DeepSeek-V3-style FP8 checkpoint from elsewhere).

    Parameters
    ----------
    src, dst : path
    dtype : {"bfloat16", "float16", "float32"}, optional
        The restored weights' type. By default the type recorded at quantization
        (``cuquant.source_dtype``), else config.json's ``torch_dtype``, else bfloat16.
    device, max_shard_size, overwrite, progress, chunk_elements
        As in `quantize_checkpoint`.

    Raises
    ------
    CheckpointError
        Among others, when quantized codes have no scale beside them.
    """
    t0 = time.perf_counter()
    if dtype is not None and dtype not in _ST_OF_FLOAT:
        raise CheckpointError(f"dtype must be bfloat16, float16 or float32; got {dtype!r}")
    max_bytes = parse_size(max_shard_size)
    backend = select_backend(device)
    chunk = chunk_elements or (GPU_CHUNK if backend.name == "cuda" else CPU_CHUNK)

    with open_checkpoint(src) as ck:
        cfg_dtype = (ck.config or {}).get("torch_dtype") or (ck.config or {}).get("dtype")
        fallback = cfg_dtype if cfg_dtype in _ST_OF_FLOAT else "bfloat16"
        mods = _engine_modules(ck, dtype)
        found = {}
        companions = set()
        if mods is None:
            _refuse_engine_tensors(ck)
            for name in ck.tensors:
                hit = recognise(ck, name)
                if hit is not None:
                    found[name] = hit
                    companions.add(name + hit[0].suffix)
            items, formats = [], set()
        else:
            items, companions = _module_items(ck, mods)
            formats = {it.record.format for it in items}
        for name, info in ck.tensors.items():
            rec = TensorRecord(name, "kept", "", info.dtype, info.shape, info.nbytes)
            if mods is not None:
                if name in companions:
                    continue
                if (name.endswith("weight") and name[: -len("weight")] in mods):
                    continue   # replaced by the module's restored weight
                items.append(_Item(rec, info, [TensorSpec(name, info.dtype, info.shape,
                                                          info.nbytes)]))
                rec.reason = "not quantized"
                continue
            if name in found:
                fmt, g = found[name]
                formats.add(fmt.name)
                fmt.function("dequantize")
                out_dt = dtype or _source_dtype(ck, name) or fallback
                n, kq = info.shape
                k = 2 * kq if fmt.grouped else kq
                rec.action, rec.reason, rec.format = "dequantized", fmt.name, fmt.name
                comp = ck.tensors[name + fmt.suffix]
                rec.bytes_in += comp.nbytes
                items.append(_Item(rec, info, [TensorSpec(name, _ST_OF_FLOAT[out_dt], (n, k))],
                                   fmt, g, comp, out_dt))
            elif name in companions:
                continue
            else:
                _refuse_orphan(ck, name, info)
                rec.reason = "not quantized"
                items.append(_Item(rec, info, [TensorSpec(name, info.dtype, info.shape,
                                                          info.nbytes)]))
        report = Report("dequantize", str(src), str(dst), ",".join(sorted(formats)) or None,
                        backend.name, {"dtype": dtype, "max_shard_size": max_bytes}, stats=False)
        report.records = [it.record for it in items]
        plan, extra, out = _prepare(ck, items, src, dst, overwrite, max_bytes)
        with out:
            prog = _Progress(progress, len(items), sum(it.record.bytes_in for it in items))

            def work(it, ck, w, p):
                if it.fmt is None:
                    _copy_raw(it, ck, w, p)
                elif isinstance(it.fmt, _Module):
                    _dequantize_module(it, ck, w, p, backend, chunk)
                else:
                    _dequantize_one(it, ck, w, p, backend, chunk)

            names, index_meta, wmap = _run(plan, ck, out, lambda shard: {"format": "pt"},
                                           work, prog)
            cfg = None
            if ck.config is not None:
                cfg = {k: v for k, v in ck.config.items() if k != "quantization_config"}
            _finish(out, ck, report, names, index_meta, wmap, cfg, extra)
    report.seconds = time.perf_counter() - t0
    return report


# ---------------------------------------------------------------------------------------
# Reading compressed-tensors and AWQ checkpoints

# quant_method values read through cuquant's own layouts (FORMATS): DeepSeek-V3's FP8 and
# cuquant's.
_OWN_METHODS = ("fp8", "cuquant")
_ENGINE_METHODS = ("compressed-tensors", "awq")
_CT_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized")


@dataclass
class _Module:
    """A quantized module of a compressed-tensors or AWQ checkpoint: how to restore
    ``base + "weight"``."""

    base: str
    kind: str            # "packed", "int8", "fp8", "awq"
    tensors: dict        # role -> tensor name
    n: int
    k: int
    group: int           # elements per scale along K (K for one per row); fp8 blocks: 128
    bits: int = 8
    symmetric: bool = True
    strategy: str = "channel"
    out_dtype: str = "bfloat16"


def _quant_config(ck: Checkpoint) -> dict | None:
    qc = (ck.config or {}).get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise CheckpointError("config.json: quantization_config is not a JSON object")
    return qc


def _bad(name: str, what: str) -> CheckpointError:
    return CheckpointError(f"tensor {name!r}: {what}; refusing to dequantize")


def _ct_group_of(qc: dict, module: str) -> tuple[str, dict]:
    """The config group (name, scheme) whose targets take `module`: a "re:" pattern or the
    module's own name first, else a group targeting a layer type (e.g. "Linear")."""
    import re

    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError("config.json: the compressed-tensors quantization_config has no "
                              "config_groups; refusing to dequantize")
    by_type = None
    for gname, scheme in groups.items():
        if not isinstance(scheme, dict):
            raise CheckpointError(f"config.json: config group {gname!r} is not a JSON object")
        for t in scheme.get("targets") or []:
            if not isinstance(t, str):
                continue
            if t.startswith("re:"):
                if re.match(t[3:], module):
                    return gname, scheme
            elif t == module or module.endswith("." + t):
                return gname, scheme
            elif by_type is None and t[:1].isupper():
                by_type = (gname, scheme)
    if by_type is None:
        raise CheckpointError(f"module {module!r} holds quantized tensors but no config group "
                              "of the quantization_config targets it; refusing to dequantize")
    return by_type


def _ct_modules(ck: Checkpoint, qc: dict, dtype: str | None) -> dict[str, _Module]:
    """The quantized modules of a compressed-tensors checkpoint, checked against the config."""
    status = qc.get("quantization_status")
    if status != "compressed":
        raise CheckpointError(f"config.json: quantization_status is {status!r}; cuquant reads "
                              "compressed-tensors checkpoints whose status is 'compressed'")
    mods: dict[str, _Module] = {}
    t = ck.tensors
    for name, info in t.items():
        if name.endswith("weight_packed"):
            base = name[: -len("weight_packed")]
        elif (name.endswith("weight_scale") and (name[: -len("_scale")]) in t
              and t[name[: -len("_scale")]].dtype in ("I8", "F8_E4M3")):
            base = name[: -len("weight_scale")]
        else:
            continue
        module = base[:-1] if base.endswith(".") else base
        gname, scheme = _ct_group_of(qc, module)
        fmt = scheme.get("format") or qc.get("format")
        w = scheme.get("weights")
        if not isinstance(w, dict):
            raise CheckpointError(f"config.json: config group {gname!r} has no weights "
                                  "arguments; refusing to dequantize")
        if fmt not in _CT_FORMATS:
            raise CheckpointError(f"config.json: config group {gname!r} has format {fmt!r}, "
                                  f"which cuquant does not read (it reads {', '.join(_CT_FORMATS)})")
        mods[base] = _ct_module(ck, base, fmt, w, gname, dtype)
    return mods


def _need(ck: Checkpoint, name: str, dtypes: tuple, what: str) -> TensorInfo:
    info = ck.tensors.get(name)
    if info is None:
        raise _bad(name, f"missing ({what})")
    if info.dtype not in dtypes:
        raise _bad(name, f"dtype {info.dtype}, expected {' or '.join(dtypes)} ({what})")
    return info


def _shape_is(info: TensorInfo, shape: tuple, what: str) -> None:
    if tuple(info.shape) != tuple(shape):
        raise _bad(info.name, f"shape {list(info.shape)}, expected {list(shape)} ({what})")


def _ct_module(ck: Checkpoint, base: str, fmt: str, w: dict, gname: str,
               dtype: str | None) -> _Module:
    bits, typ = w.get("num_bits"), w.get("type")
    strategy, sym = w.get("strategy"), w.get("symmetric", True)
    where = f"config group {gname!r}"
    packed = fmt == "pack-quantized"
    scale = _need(ck, base + "weight_scale", HALF_SCALES if packed else tuple(FLOAT_DTYPES),
                  "the weight's scale")
    def out_dt(codes_name):
        return dtype or _source_dtype(ck, codes_name) or FLOAT_DTYPES[scale.dtype]

    if packed:
        if typ != "int" or bits not in (4, 8):
            raise CheckpointError(f"config.json: {where}: pack-quantized {typ} weights of "
                                  f"{bits} bits are not read (4 or 8-bit int)")
        if not sym and bits != 4:
            raise CheckpointError(f"config.json: {where}: asymmetric {bits}-bit packs are not "
                                  "read (4-bit ones are)")
        words = _need(ck, base + "weight_packed", ("I32",), "packed codes")
        shp = _need(ck, base + "weight_shape", ("I64", "I32"), "the weight's shape")
        if tuple(shp.shape) != (2,):
            raise _bad(shp.name, f"shape {list(shp.shape)}, expected [2]")
        n, k = (int(v) for v in ck.file_of(shp.name).read(shp.name))
        if n <= 0 or k <= 0 or (k * bits) % 32:
            raise _bad(shp.name, f"weight shape [{n}, {k}]: K * {bits} bits must fill whole "
                                 "int32 words")
        _shape_is(words, (n, k * bits // 32), f"[N, K*{bits}/32] for weight_shape [{n}, {k}]")
        if strategy == "group":
            g = w.get("group_size")
            if not isinstance(g, int) or g <= 0 or k % g:
                raise CheckpointError(f"config.json: {where}: group_size {g!r} does not divide "
                                      f"K={k} of {base}weight_packed")
        elif strategy == "channel":
            g = k
        else:
            raise CheckpointError(f"config.json: {where}: pack-quantized strategy {strategy!r} "
                                  "is not read (group or channel)")
        _shape_is(scale, (n, k // g), f"[N, K/{g}]")
        tensors = {"packed": words.name, "scale": scale.name, "shape": shp.name}
        if not sym:
            zp = _need(ck, base + "weight_zero_point", ("I32",), "the packed zero points")
            _shape_is(zp, (-(-n * bits // 32), k // g), f"[ceil(N*{bits}/32), K/{g}]")
            tensors["zero"] = zp.name
        return _Module(base, "packed", tensors, n, k, g, bits, bool(sym), strategy,
                       out_dt(words.name))
    codes = _need(ck, base + "weight", ("I8",) if typ == "int" else ("F8_E4M3",),
                  f"{fmt} codes")
    if len(codes.shape) != 2:
        raise _bad(codes.name, f"shape {list(codes.shape)}, expected [N, K]")
    n, k = codes.shape
    if bits != 8 or not sym or (typ == "int") != (fmt == "int-quantized" or
                                                 codes.dtype == "I8"):
        raise CheckpointError(f"config.json: {where}: {fmt} {typ} weights of {bits} bits, "
                              f"symmetric={sym}, are not read (symmetric 8-bit int or fp8)")
    if base + "weight_zero_point" in ck.tensors:
        raise _bad(base + "weight_zero_point", "zero points of int8/fp8 codes are not read")
    kind = "int8" if codes.dtype == "I8" else "fp8"
    if strategy == "channel":
        _shape_is(scale, (n, 1), "[N, 1]")
        g = k
    elif strategy == "tensor":
        if scale.numel() != 1:
            raise _bad(scale.name, f"shape {list(scale.shape)}, expected one value (tensor)")
        g = k
    elif strategy == "block" and kind == "fp8" and w.get("block_structure") in ([128, 128],):
        _shape_is(scale, (-(-n // 128), -(-k // 128)), "[ceil(N/128), ceil(K/128)]")
        g = 128
    else:
        raise CheckpointError(f"config.json: {where}: {kind} strategy {strategy!r} "
                              f"(block_structure {w.get('block_structure')}) is not read")
    return _Module(base, kind, {"codes": codes.name, "scale": scale.name}, n, k, g, 8, True,
                   strategy, out_dt(codes.name))


HALF_SCALES = ("F16", "BF16")


def _awq_modules(ck: Checkpoint, qc: dict, dtype: str | None) -> dict[str, _Module]:
    version = str(qc.get("version", qc.get("format", "gemm"))).lower()
    bits, g0 = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size"))
    if version != "gemm":
        raise CheckpointError(f"config.json: AWQ version {version!r} is not read (gemm is)")
    if bits != 4:
        raise CheckpointError(f"config.json: AWQ with {bits!r} bits is not read (4 is)")
    if qc.get("zero_point", True) is not True:
        raise CheckpointError("config.json: AWQ without zero points is not read")
    if not isinstance(g0, int) or g0 == 0 or g0 < -1:
        raise CheckpointError(f"config.json: AWQ group_size {g0!r} is not a group size")
    mods = {}
    for name in ck.tensors:
        if not name.endswith("qweight"):
            continue
        base = name[: -len("qweight")]
        qw = _need(ck, name, ("I32",), "AWQ's packed codes")
        if len(qw.shape) != 2:
            raise _bad(name, f"shape {list(qw.shape)}, expected [K, N/8]")
        k, n = qw.shape[0], qw.shape[1] * 8
        g = k if g0 == -1 else g0
        if k % g:
            raise _bad(name, f"K={k} is not a multiple of the group size {g}")
        sc = _need(ck, base + "scales", ("F16",), "AWQ's scales")
        _shape_is(sc, (k // g, n), f"[K/{g}, N]")
        qz = _need(ck, base + "qzeros", ("I32",), "AWQ's packed zero points")
        _shape_is(qz, (k // g, n // 8), f"[K/{g}, N/8]")
        mods[base] = _Module(base, "awq", {"qweight": name, "scales": sc.name, "qzeros": qz.name},
                             n, k, g, 4, False, "group",
                             dtype or _source_dtype(ck, name) or "float16")
    return mods


def _engine_modules(ck: Checkpoint, dtype: str | None = None) -> dict[str, _Module] | None:
    """The quantized modules of a compressed-tensors or AWQ checkpoint; None for a
    checkpoint read through cuquant's own layouts. Refuses methods cuquant does not read."""
    qc = _quant_config(ck)
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method in _OWN_METHODS:
        return None
    if method == "compressed-tensors":
        return _ct_modules(ck, qc, dtype)
    if method == "awq":
        return _awq_modules(ck, qc, dtype)
    raise CheckpointError(f"config.json: quantization_config has quant_method {method!r}, which "
                          f"cuquant does not read (it reads {', '.join(_ENGINE_METHODS)}, "
                          f"{', '.join(_OWN_METHODS)}); refusing to dequantize")


def _module_items(ck: Checkpoint, mods: dict[str, _Module]) -> tuple[list[_Item], set]:
    """One item for each module (its inputs consumed), and the names consumed."""
    items, used = [], set()
    for m in mods.values():
        names = list(m.tensors.values())
        used.update(names)
        first = ck.tensors[names[0]]
        rec = TensorRecord(m.base + "weight", "dequantized", _module_format(ck, m),
                           first.dtype, (m.n, m.k), sum(ck.tensors[x].nbytes for x in names))
        rec.format = rec.reason
        it = _Item(rec, first, [TensorSpec(m.base + "weight", _ST_OF_FLOAT[m.out_dtype],
                                           (m.n, m.k))], fmt=m, out_dtype=m.out_dtype)
        items.append(it)
    return items, used


def _module_format(ck: Checkpoint, m: _Module) -> str:
    if m.kind == "awq":
        return "AWQ"
    if m.kind == "packed":
        name = f"W{m.bits}A16" + ("" if m.symmetric else "_ASYM")
        return name if m.strategy == "group" and m.group == 128 else f"{name} ({m.strategy}" + \
            (f" {m.group})" if m.strategy == "group" else ")")
    what = {"channel": "per channel", "tensor": "per tensor", "block": "128x128 blocks"}
    return f"{m.kind} {what[m.strategy]}"


def _dequantize_module(it: _Item, ck: Checkpoint, w: SafetensorsWriter, progress: _Progress,
                       backend: Backend, chunk: int) -> None:
    import cuquant

    m: _Module = it.fmt
    xp = backend.xp
    out_name = it.outputs[0].name
    t = m.tensors

    def read(role, r0=None, r1=None):
        f = ck.file_of(t[role])
        return f.read(t[role]) if r0 is None else f.read_rows(t[role], r0, r1)

    if m.kind == "awq":
        # Stored transposed: restored whole, then written in bands of rows.
        u = awq_unpack(xp, backend.to_device(read("qweight")))             # [K, N]
        q = pack_nibbles(xp, xp.ascontiguousarray(u.T))                     # [N, K/2]
        del u
        sc = np.ascontiguousarray(read("scales").T)                         # [N, K/G]
        z = np.ascontiguousarray(awq_unpack(np, read("qzeros")).T).astype(np.float16)
        x = cuquant.dequantize_groupwise_zero_point(q, backend.to_device(sc),
                                                    backend.to_device(z), m.group, m.out_dtype,
                                                    bits=4)
        w.write(out_name, backend.to_host(x))
        progress.advance(it.record.bytes_in, out_name)
    elif m.kind == "packed":
        sdt = ck.tensors[t["scale"]].dtype
        zeros_all = None
        if not m.symmetric:
            zeros_all = unpack_rows_4bit(np, read("zero"), m.n)
        align = 8 if not m.symmetric else 1
        for r0, r1 in _bands(m.n, m.k, align, chunk):
            words = backend.to_device(read("packed", r0, r1))
            q = bytes_of_words(xp, words)          # [r, K/2] (4 bits) or [r, K] (8 bits)
            sc = read("scale", r0, r1)
            if zeros_all is None:
                z = np.full(sc.shape, 1 << (m.bits - 1), np.float32)
            else:
                z = zeros_all[r0:r1].astype(np.float32)
            z = z.astype(numpy_dtype(sdt))
            x = cuquant.dequantize_groupwise_zero_point(q, backend.to_device(sc),
                                                        backend.to_device(z), m.group,
                                                        m.out_dtype, bits=m.bits)
            w.write(out_name, backend.to_host(x))
            progress.advance(words.nbytes + sc.nbytes, out_name)
    else:
        deq = (cuquant.dequantize_int8_per_channel if m.kind == "int8"
               else cuquant.dequantize_fp8_per_row)
        block = m.strategy == "block"
        s_all = read("scale").astype(np.float32)
        for r0, r1 in _bands(m.n, m.k, 128 if block else 1, chunk):
            codes = read("codes", r0, r1)
            if block:
                s = s_all[r0 // 128: _cdiv(r1, 128)]
                x = cuquant.dequantize_fp8_per_block(backend.to_device(codes),
                                                     backend.to_device(s), m.out_dtype)
            else:
                s = (s_all.reshape(-1)[r0:r1] if m.strategy == "channel"
                     else np.full(r1 - r0, s_all.reshape(-1)[0], np.float32))
                x = deq(backend.to_device(codes), backend.to_device(np.ascontiguousarray(s)),
                        m.out_dtype)
            w.write(out_name, backend.to_host(x))
            progress.advance(codes.nbytes, out_name)
    it.record.bytes_out = it.out_bytes
    it.record.outputs = [out_name]
    progress.advance(0, out_name, finished=True)


def _source_dtype(ck: Checkpoint, name: str) -> str | None:
    meta = ck.metadata_of(name)
    if meta.get("cuquant.source_dtype") in _ST_OF_FLOAT:
        return meta["cuquant.source_dtype"]
    many = meta.get("cuquant.source_dtypes")
    if many:
        try:
            d = json.loads(many).get(name)
        except (json.JSONDecodeError, AttributeError):
            d = None
        if d in _ST_OF_FLOAT:
            return d
    return None


def _refuse_engine_tensors(ck: Checkpoint) -> None:
    """compressed-tensors' or AWQ's tensors without the config that says how to read them
    would be copied as if they were weights."""
    for name, info in ck.tensors.items():
        scale = ck.tensors.get(name + "_scale")
        ct_codes = (info.dtype in ("I8", "F8_E4M3") and scale is not None
                    and (scale.dtype != "F32" or len(scale.shape) != 1))
        if name.endswith(("weight_packed", "qweight")) or ct_codes:
            raise CheckpointError(
                f"tensor {name!r} holds packed codes (compressed-tensors or AWQ), but there is "
                "no quantization_config of that method in config.json to read them by; "
                "refusing to copy codes as if they were weights")


def _refuse_orphan(ck: Checkpoint, name: str, info: TensorInfo) -> None:
    """Quantized codes without their scale cannot be restored: copying them as if they
    were weights would hand a model garbage."""
    fmt_name = ck.metadata_of(name).get("cuquant.format")
    marked = FORMATS.get(fmt_name)
    is_codes = info.dtype.startswith("F8_") or (
        marked is not None and info.dtype == marked.code_dtype and len(info.shape) == 2
        and name.endswith("weight"))
    if not is_codes:
        return
    if marked is not None and info.dtype == marked.code_dtype:
        wanted = [name + marked.suffix]
    else:
        wanted = [name + f.suffix for f in FORMATS.values() if f.code_dtype == info.dtype]
    have = [w for w in dict.fromkeys(wanted) if w in ck.tensors]
    if have:
        raise CheckpointError(f"tensor {name!r} ({info.dtype} {list(info.shape)}): its companion "
                              f"{have[0]!r} has shape {list(ck.tensors[have[0]].shape)}, which "
                              "does not fit; the checkpoint is damaged")
    raise CheckpointError(f"tensor {name!r} holds quantized codes ({info.dtype}) but its scale "
                          f"{' or '.join(repr(w) for w in dict.fromkeys(wanted))} is missing; "
                          "refusing to copy codes as if they were weights")


def _dequantize_one(it: _Item, ck: Checkpoint, w: SafetensorsWriter, progress: _Progress,
                    backend: Backend, chunk: int) -> None:
    fmt, g = it.fmt, it.group
    dfn = fmt.function("dequantize")
    f, fc = ck.file_of(it.src.name), ck.file_of(it.companion.name)
    n, kq = it.src.shape
    k = 2 * kq if fmt.grouped else kq
    kw = {"group_size": g} if fmt.grouped else {}
    for r0, r1 in _bands(n, k, fmt.row_align, chunk):
        codes = f.read_rows(it.src.name, r0, r1)
        s0, s1 = fmt.companion_rows(r0, r1, n, k, g)
        comp = fc.read_rows(it.companion.name, s0, s1)
        x = dfn(backend.to_device(codes), backend.to_device(comp), it.out_dtype, **kw)
        w.write(it.src.name, backend.to_host(x))
        progress.advance(codes.nbytes + comp.nbytes, it.src.name)
    it.record.bytes_out = it.out_bytes
    it.record.outputs = [it.src.name]
    progress.advance(0, it.src.name, finished=True)


# ---------------------------------------------------------------------------------------
# inspect

_ROLE_WORDS = {"packed": "codes", "codes": "codes", "qweight": "codes", "scale": "scale",
               "scales": "scale", "zero": "zero points", "qzeros": "zero points",
               "shape": "shape"}


def inspect_checkpoint(path) -> dict:
    """What a checkpoint holds: per file its metadata, per tensor its dtype, shape, bytes
    and role (high precision, the codes of a format, or a format's scale).

    Returns
    -------
    dict
        ``{"files": [{"path", "metadata", "tensors": [{"name", "dtype", "shape", "bytes",
        "role"}]}], "totals": {role: {"tensors", "bytes"}}, "problems": [str]}``
    """
    with open_checkpoint(path) as ck:
        roles: dict[str, str] = {}
        problems = []
        mods = None
        try:
            mods = _engine_modules(ck)
            if mods is None:
                _refuse_engine_tensors(ck)
        except CheckpointError as e:
            problems.append(str(e))
        for m in (mods or {}).values():
            label = _module_format(ck, m)
            for role, name in m.tensors.items():
                roles[name] = f"{label} {_ROLE_WORDS.get(role, role)}"
        for name in ck.tensors:
            if mods is not None or name in roles:
                continue
            hit = recognise(ck, name)
            if hit is not None:
                fmt = hit[0]
                roles[name] = f"{fmt.name} codes"
                roles[name + fmt.suffix] = f"{fmt.name} {'params' if fmt.grouped else 'scale'}"
        for name, info in ck.tensors.items():
            if name in roles:
                continue
            if mods is not None or problems:
                roles[name] = "high precision" if info.dtype in FLOAT_DTYPES else "other"
                continue
            try:
                _refuse_orphan(ck, name, info)
                roles[name] = "high precision" if info.dtype in FLOAT_DTYPES else "other"
            except CheckpointError as e:
                roles[name] = "codes, no scale!"
                problems.append(str(e))
        files, totals = [], {}
        for f in ck.files:
            rows = []
            for name, info in f.tensors.items():
                role = roles[name]
                rows.append({"name": name, "dtype": info.dtype, "shape": list(info.shape),
                             "bytes": info.nbytes, "role": role})
                t = totals.setdefault(role, {"tensors": 0, "bytes": 0})
                t["tensors"] += 1
                t["bytes"] += info.nbytes
            files.append({"path": f.path, "bytes": os.path.getsize(f.path),
                          "metadata": f.metadata, "tensors": rows})
        return {"files": files, "totals": totals, "problems": problems,
                "quantization_config": (ck.config or {}).get("quantization_config")}

