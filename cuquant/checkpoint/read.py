"""Reading a checkpoint: its files and shards, which tensors are quantized and in what
format, including compressed-tensors and AWQ checkpoints."""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from .formats import _ST_OF_FLOAT, CheckpointError, FLOAT_DTYPES, Format, FORMATS
from .plan import _Item
from .report import TensorRecord
from .safetensors import SafetensorsFile, TensorInfo, TensorSpec


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


# quant_method values read through cuquant's own layouts (FORMATS): DeepSeek-V3's FP8 and
# cuquant's.
_OWN_METHODS = ("fp8", "cuquant")


_ENGINE_METHODS = ("compressed-tensors", "awq")


_CT_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized",
               "nvfp4-pack-quantized", "mxfp4-pack-quantized")


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
    if fmt in _FP4_CT_FORMATS:
        return _ct_fp4_module(ck, base, fmt, w, where, dtype)
    packed = fmt == "pack-quantized"
    scale = _need(ck, base + "weight_scale", HALF_SCALES if packed else tuple(FLOAT_DTYPES),
                  "the weight's scale")
    def out_dt(codes_name):
        return dtype or _source_dtype(ck, codes_name, base + "weight") or FLOAT_DTYPES[scale.dtype]

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
        if scale.numel != 1:
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


# compressed-tensors' fp4 formats: format -> (kind, strategy, block, scale dtype)
_FP4_CT_FORMATS = {"nvfp4-pack-quantized": ("nvfp4", "tensor_group", 16, "F8_E4M3"),
                   "mxfp4-pack-quantized": ("mxfp4", "group", 32, "U8")}


def _ct_fp4_module(ck: Checkpoint, base: str, fmt: str, w: dict, where: str,
                   dtype: str | None) -> _Module:
    """An NVFP4 or MXFP4 module (docs/checkpoint-formats.md): uint8 codes [N, K/2], a scale
    per block, and for NVFP4 a float32 global (encode) scale."""
    import numpy as np

    kind, strategy, block, scale_dt = _FP4_CT_FORMATS[fmt]
    if (w.get("num_bits"), w.get("type"), w.get("strategy"), w.get("group_size")) != \
            (4, "float", strategy, block) or w.get("symmetric", True) is not True:
        raise CheckpointError(
            f"config.json: {where}: {fmt} weights must be symmetric 4-bit float, strategy "
            f"{strategy!r}, group_size {block}; got num_bits {w.get('num_bits')!r}, type "
            f"{w.get('type')!r}, strategy {w.get('strategy')!r}, group_size "
            f"{w.get('group_size')!r}, symmetric {w.get('symmetric', True)!r}")
    codes = _need(ck, base + "weight_packed", ("U8",), "fp4 codes, two a byte")
    if len(codes.shape) != 2:
        raise _bad(codes.name, f"shape {list(codes.shape)}, expected [N, K/2]")
    n, k = codes.shape[0], 2 * codes.shape[1]
    if k % block:
        raise _bad(codes.name, f"K={k} is not a multiple of the {kind.upper()} block of {block}")
    scale = _need(ck, base + "weight_scale", (scale_dt,), "the block scales")
    _shape_is(scale, (n, k // block), f"[N, K/{block}]")
    if base + "weight_zero_point" in ck.tensors:
        raise _bad(base + "weight_zero_point", f"zero points of {fmt} codes are not read")
    tensors = {"packed": codes.name, "scale": scale.name}
    if kind == "nvfp4":
        gs = _need(ck, base + "weight_global_scale", ("F32",), "the global scale")
        if gs.numel != 1:
            raise _bad(gs.name, f"shape {list(gs.shape)}, expected [1]")
        v = np.asarray(ck.file_of(gs.name).read(gs.name), np.float32).reshape(-1)[0]
        if not (np.isfinite(v) and v > 0):
            raise _bad(gs.name, f"global scale {float(v)!r}, expected a positive finite float32")
        tensors["global_scale"] = gs.name
    if base + "input_global_scale" in ck.tensors:
        # The activations' global scale: no part of the restored weights.
        tensors["input_global_scale"] = base + "input_global_scale"
    cfg_dt = (ck.config or {}).get("torch_dtype") or (ck.config or {}).get("dtype")
    out = dtype or _source_dtype(ck, codes.name, base + "weight") or (
        cfg_dt if cfg_dt in _ST_OF_FLOAT else "bfloat16")
    return _Module(base, kind, tensors, n, k, block, 4, True, strategy, out)


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
                             dtype or _source_dtype(ck, name, base + "weight") or "float16")
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
    if m.kind in ("nvfp4", "mxfp4"):
        return m.kind.upper()
    if m.kind == "packed":
        name = f"W{m.bits}A16" + ("" if m.symmetric else "_ASYM")
        return name if m.strategy == "group" and m.group == 128 else f"{name} ({m.strategy}" + \
            (f" {m.group})" if m.strategy == "group" else ")")
    what = {"channel": "per channel", "tensor": "per tensor", "block": "128x128 blocks"}
    return f"{m.kind} {what[m.strategy]}"


def _source_dtype(ck: Checkpoint, name: str, weight: str | None = None) -> str | None:
    """The dtype recorded at quantization for the weight stored as tensor `name` (its map
    entry is the weight's name, `weight`, where that differs)."""
    meta = ck.metadata_of(name)
    if meta.get("cuquant.source_dtype") in _ST_OF_FLOAT:
        return meta["cuquant.source_dtype"]
    many = meta.get("cuquant.source_dtypes")
    if many:
        try:
            d = json.loads(many).get(weight or name)
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
