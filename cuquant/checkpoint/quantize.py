"""`quantize_checkpoint`: the 2-D weights of a checkpoint quantized, the rest copied."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np

from .backend import Backend, select_backend
from .engines import (
    awq_pack,
    awq_quantization_config,
    ct_quantization_config,
    ENGINE_FORMATS,
    EngineFormat,
    FP4Format,
    nibbles,
    pack_rows_4bit,
    words_of_bytes,
)
from .formats import (
    _EMBEDDINGS,
    CheckpointError,
    COMMAND_FORMATS,
    CPU_CHUNK,
    DEFAULT_SKIP,
    FLOAT_DTYPES,
    FORMATS,
    GPU_CHUNK,
    parse_size,
    SCALE_FORMATS,
)
from .microscaling import quantize_fp4_weight
from .plan import _decide, _Item, _matches
from .read import Checkpoint, open_checkpoint
from .report import _worse, Report, TensorRecord
from .safetensors import SafetensorsWriter, TensorSpec
from .write import _bands, _copy_raw, _copy_reads, _finish, _prepare, _Progress, _run


def quantize_checkpoint(src, dst, format: str, *, skip: Sequence[str] = (),
                        default_skip: bool = True, scale_format: str = "float32",
                        group_size: int = 128, device: str = "auto",
                        max_shard_size="5GB", overwrite: bool = False, stats: bool = True,
                        progress=None, chunk_elements: int | None = None, scheduler=None,
                        resume: bool = False, _cluster=None) -> Report:
    """Quantize the 2-D weight matrices of a safetensors checkpoint.

    Parameters
    ----------
    src : path
        A ``.safetensors`` file, a directory of shards, or a ``*.safetensors.index.json``.
    dst : path
        The output directory (refused when it exists, unless `overwrite`).
    format : str
        One of `COMMAND_FORMATS` ("W8A8", "FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "W8A16",
        "AWQ", "NVFP4", "MXFP4", "fp8-block"), which engines load; or "int8-channel",
        "int4-group", "fp8-row", cuquant's own layouts, which no engine loads
        (``quant_method: "cuquant"``).
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
    scheduler : str or distributed.Client, optional
        Run the bands on a Dask cluster whose workers see the same filesystem: a scheduler
        address (``tcp://host:8786``), a scheduler file (``*.json``), ``"local:N"`` (N
        worker processes on this machine) or a Client. The output is byte for byte the
        one of a run without it (cuquant/checkpoint/distributed.py).
    resume : bool
        With `scheduler`: continue a run whose client died, redoing only the bands it had
        not finished (refused when the input or the options changed).

    Returns
    -------
    Report
    """
    if _cluster is None and (scheduler is not None or resume):
        kwargs = dict(locals())  # the arguments, before any other name is bound
        from .distributed import on_cluster
        return on_cluster(quantize_checkpoint, kwargs)
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
    backend = select_backend(device) if _cluster is None else _cluster.backend
    prepare, run = (_prepare, _run) if _cluster is None else (_cluster.prepare, _cluster.run)
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
        plan, extra, out = prepare(ck, items, src, dst, overwrite, max_bytes)
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
                elif isinstance(fmt, FP4Format):
                    quantize_fp4_weight(it, ck, w, p, backend, chunk, stats)
                elif engine:
                    _quantize_engine(it, ck, w, p, backend, chunk, stats)
                else:
                    _quantize_one(it, ck, w, p, backend, scale_format, chunk, stats)

            def reads(it):
                if it.fmt is None:
                    return _copy_reads(it)
                n, k = it.src.shape
                return [("rows", it.src.name, r0, r1)
                        for r0, r1 in _bands(n, k, it.fmt.row_align, chunk)]

            if _cluster is not None:
                names, index_meta, wmap = run(plan, ck, out, metadata_for, work, prog)
            else:
                try:
                    names, index_meta, wmap = run(plan, ck, out, metadata_for, work, prog, reads,
                                                  backend.host_buffer)
                finally:
                    backend.release_host_memory()
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
    for r0, r1 in _bands(n, k, fmt.row_align, chunk, it.rows):
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


# Formats coded a channel of the weight at a time: the library's quantizer (scale in the
# model dtype) and dequantizer of each.
_PER_CHANNEL = {
    "int8": ("quantize_int8_per_channel", "dequantize_int8_per_channel"),
    "fp8": ("quantize_fp8_per_row", "dequantize_fp8_per_row"),
}


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
    for r0, r1 in _bands(n, k, fmt.row_align, chunk, it.rows):
        host = f.read_rows(name, r0, r1)
        x = backend.to_device(host)
        if fmt.codes in _PER_CHANNEL:
            quantize, dequantize = (getattr(cuquant, f) for f in _PER_CHANNEL[fmt.codes])
            q, sc = quantize(x, scale_dtype=model_dt)
            s32 = _host_float(backend, sc, np.float32)
            w.write(out["weight"], backend.to_host(q))
            w.write(out["weight_scale"], backend.to_host(sc))
            deq = dequantize(q, backend.to_device(s32), "float32") if stats else None
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
