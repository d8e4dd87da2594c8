"""`dequantize_checkpoint`: a quantized checkpoint back to floating point."""

from __future__ import annotations

import time

import numpy as np

from .backend import Backend, select_backend
from .engines import awq_unpack, bytes_of_words, pack_nibbles, unpack_rows_4bit
from .formats import _cdiv, _ST_OF_FLOAT, CheckpointError, CPU_CHUNK, GPU_CHUNK, parse_size
from .microscaling import dequantize_fp4_module
from .plan import _Item
from .read import (
    _engine_modules,
    _Module,
    _module_items,
    _refuse_engine_tensors,
    _refuse_orphan,
    _source_dtype,
    Checkpoint,
    open_checkpoint,
    recognise,
)
from .report import Report, TensorRecord
from .safetensors import numpy_dtype, SafetensorsWriter, TensorSpec
from .write import _bands, _copy_raw, _finish, _prepare, _Progress, _run


def dequantize_checkpoint(src, dst, *, dtype: str | None = None, device: str = "auto",
                          max_shard_size="5GB", overwrite: bool = False, progress=None,
                          chunk_elements: int | None = None, scheduler=None,
                          resume: bool = False, _cluster=None) -> Report:
    """Restore a float checkpoint from a quantized one (any format of `FORMATS`, from
    cuquant or a DeepSeek-V3-style FP8 checkpoint from elsewhere).

    Parameters
    ----------
    src, dst : path
    dtype : {"bfloat16", "float16", "float32"}, optional
        The restored weights' type. By default the type recorded at quantization
        (``cuquant.source_dtype``), else config.json's ``torch_dtype``, else bfloat16.
    device, max_shard_size, overwrite, progress, chunk_elements, scheduler, resume
        As in `quantize_checkpoint`.

    Raises
    ------
    CheckpointError
        Among others, when quantized codes have no scale beside them.
    """
    if _cluster is None and (scheduler is not None or resume):
        kwargs = dict(locals())  # the arguments, before any other name is bound
        from .distributed import on_cluster
        return on_cluster(dequantize_checkpoint, kwargs)
    t0 = time.perf_counter()
    if dtype is not None and dtype not in _ST_OF_FLOAT:
        raise CheckpointError(f"dtype must be bfloat16, float16 or float32; got {dtype!r}")
    max_bytes = parse_size(max_shard_size)
    backend = select_backend(device) if _cluster is None else _cluster.backend
    prepare, run = (_prepare, _run) if _cluster is None else (_cluster.prepare, _cluster.run)
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
        plan, extra, out = prepare(ck, items, src, dst, overwrite, max_bytes)
        with out:
            prog = _Progress(progress, len(items), sum(it.record.bytes_in for it in items))

            def work(it, ck, w, p):
                if it.fmt is None:
                    _copy_raw(it, ck, w, p)
                elif isinstance(it.fmt, _Module):
                    _dequantize_module(it, ck, w, p, backend, chunk)
                else:
                    _dequantize_one(it, ck, w, p, backend, chunk)

            names, index_meta, wmap = run(plan, ck, out, lambda shard: {"format": "pt"},
                                          work, prog)
            cfg = None
            if ck.config is not None:
                cfg = {k: v for k, v in ck.config.items() if k != "quantization_config"}
            _finish(out, ck, report, names, index_meta, wmap, cfg, extra)
    report.seconds = time.perf_counter() - t0
    return report


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
    elif m.kind in ("nvfp4", "mxfp4"):
        dequantize_fp4_module(m, read, w, out_name, progress, backend, chunk)
    elif m.kind == "packed":
        sdt = ck.tensors[t["scale"]].dtype
        zeros_all = None
        if not m.symmetric:
            zeros_all = unpack_rows_4bit(np, read("zero"), m.n)
        align = 8 if not m.symmetric else 1
        for r0, r1 in _bands(m.n, m.k, align, chunk, it.rows):
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
        for r0, r1 in _bands(m.n, m.k, 128 if block else 1, chunk, it.rows):
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


def _dequantize_one(it: _Item, ck: Checkpoint, w: SafetensorsWriter, progress: _Progress,
                    backend: Backend, chunk: int) -> None:
    fmt, g = it.fmt, it.group
    dfn = fmt.function("dequantize")
    f, fc = ck.file_of(it.src.name), ck.file_of(it.companion.name)
    n, kq = it.src.shape
    k = 2 * kq if fmt.grouped else kq
    kw = {"group_size": g} if fmt.grouped else {}
    for r0, r1 in _bands(n, k, fmt.row_align, chunk, it.rows):
        codes = f.read_rows(it.src.name, r0, r1)
        s0, s1 = fmt.companion_rows(r0, r1, n, k, g)
        comp = fc.read_rows(it.companion.name, s0, s1)
        x = dfn(backend.to_device(codes), backend.to_device(comp), it.out_dtype, **kw)
        w.write(it.src.name, backend.to_host(x))
        progress.advance(codes.nbytes + comp.nbytes, it.src.name)
    it.record.bytes_out = it.out_bytes
    it.record.outputs = [it.src.name]
    progress.advance(0, it.src.name, finished=True)
