"""DeepSpeed's group-wise format on the GPU (cuda_src/groupwise.cu): its format policies
in the shared group-wise kernel families, its outputs, and the batched dequantizer."""

from __future__ import annotations

import ctypes
import itertools
import math
import struct

import numpy as np

from .._core import replay as _fast
from .._core.arrays import contiguous, cupy_module, outcome, require_cupy, to_jax
from .._core.dtypes import FLOATS, INT4, INT8, FloatType
from .._core.validate import BITS
from .._numpy.groupwise import packed_shape, unpacked_shape
from . import kernels as _kernels
from . import launch as _gpu
from .groups import (BATCH_ROUNDS, DQ_THREADS, DQ_UNROLL, QuantizeRun, _params_ready,
                     dequant_kernels, dequant_units, dequantize_to_new, quant_specializations,
                     quantize_plan, TWO_PASS_UNITS)
from .policy import DEFAULT_POLICY

SRC = "groupwise.cu"


def code_dtype(bits: int) -> np.dtype:
    """DeepSpeed codes: int8 storage for both widths (4-bit ones packed two a byte)."""
    return (INT4 if bits == 4 else INT8).numpy


def _ds_format(bits: int) -> str:
    return f"cq::DeepSpeed<{bits}>"


def _ds_codes(bits: int, symmetric: bool) -> str:
    return f"cq::DeepSpeedCodes<{bits}, {'true' if symmetric else 'false'}>"


def batched_expr(out: FloatType) -> str:
    return f"cq::dequantize_batched<{out.cxx}>"


def specializations():
    """Every (source, name expression) this module can launch."""
    yield from quant_specializations(SRC, _ds_format, FLOATS.values(), holds=(2, 4, 8),
                                     two_pass_units=TWO_PASS_UNITS)
    for bits, sym, out in itertools.product(BITS, (False, True), FLOATS.values()):
        for expr in dequant_kernels(_ds_codes(bits, sym), out, bits, DQ_UNROLL):
            yield SRC, expr
    for out in FLOATS.values():
        yield SRC, batched_expr(out)


_plans = _gpu.plan_table()  # outputs and batched launches by problem


_F32 = np.dtype(np.float32)


def quantize(stream, x, t, bits, sym, g, policy=DEFAULT_POLICY):
    xc = contiguous(x)
    key = ("outputs", x.shape, bits, sym, g)
    outputs = _plans.get(key)
    if outputs is None:
        outputs = _gpu.remember(_plans, key, _gpu.Outputs(
            (packed_shape(x.shape, bits), code_dtype(bits)),
            ((x.size // g, 1 if sym else 2), _F32)))
    plan = quantize_plan(SRC, _ds_format, xc, t, bits, g, policy=policy)
    if plan is None:
        return outputs.make(stream)[0], False
    run = QuantizeRun(outputs, plan, int(sym))
    if xc is x:
        _fast.offer(run)
    return run(stream, (xc.data.ptr,)), False


def dequantize(stream, q, params, bits, sym, g, out, policy=DEFAULT_POLICY):
    qc, pc = contiguous(q), _params_ready(params)
    return dequantize_to_new(stream, SRC, _ds_codes(bits, sym), out, bits, g, qc, pc, None,
                             DQ_UNROLL, qc is q and pc is params, policy)


BATCH_ITEMS = 63  # items a launch: its table is the kernel's argument (groups/batched.cuh)
_ITEM = struct.Struct("<8Q")  # one BatchItem: 8 int64 words
_TABLE_BYTES = 64 * BATCH_ITEMS + 8  # BatchTable: the items, n_items, padding to 8 bytes


class BatchRun:
    """One batched dequantization from the stream and each item's (q, params) addresses:
    each item's output made (`launch.Outputs.make`'s rules: CuPy's pool, torch's allocator on a
    torch stream, the caller's buffers where given), the items' table written into the
    kernel's argument, one launch for every BATCH_ITEMS items. Nothing is copied to the
    device, so the call can be captured in a CUDA graph. The whole way runs it, and the
    replay cache keeps it as the replay of repeated batches."""

    __slots__ = ("outputs", "rows", "launch")

    def __init__(self, outputs, rows, launch):
        # outputs: one launch.Outputs an item; rows: (item, units, d, blocks, magic_shift,
        # kind) of each item with work.
        self.outputs, self.rows, self.launch = outputs, rows, launch

    def __call__(self, stream, ptrs):
        results, outs = [], []
        for o in self.outputs:
            (res,), (p,) = o.make(stream)
            results.append(res)
            outs.append(p)
        rows = self.rows
        for start in range(0, len(rows), BATCH_ITEMS):
            table = ctypes.create_string_buffer(_TABLE_BYTES)
            block = 0
            for j, (i, units, d, blocks, ms, kind) in enumerate(rows[start:start + BATCH_ITEMS]):
                qp, pp = ptrs[i]
                _ITEM.pack_into(table, 64 * j, qp, pp, outs[i], units, d, block, ms, kind)
                block += blocks
            struct.pack_into("<i", table, 64 * BATCH_ITEMS, min(BATCH_ITEMS, len(rows) - start))
            self.launch.with_struct(block, DQ_THREADS, stream, table)
        return results


def batched(checked, out: FloatType, stream, batch=None):
    cp = require_cupy("dequantize_groupwise_batched")
    first = checked[0][0]
    device = first.device
    if all(a.family == "torch" for a, *_rest in checked):
        # torch's current stream (or `stream`), the outputs from torch's allocator
        ptr = _gpu.torch_stream_ptr(device) if stream is None else stream.ptr
        ts = _gpu.torch_stream(device, ptr)
        with cp.cuda.Device(device), ts.cupy():
            return _run_batched(checked, out, ts, device)
    if stream is None and first.family == "jax":
        stream = _gpu.jax_stream(device)
    with cp.cuda.Device(device):
        if stream is None:
            results = _run_batched(checked, out, cp.cuda.get_current_stream(), device, batch)
            return [outcome(a, r) for (a, *_rest), r in zip(checked, results)]
        with stream:  # results handed over on the launch stream
            results = _run_batched(checked, out, stream, device)
            # JAX results keep the inputs alive (see `to_jax`)
            return [to_jax(a, r, False, checked) if a.family == "jax" else outcome(a, r)
                    for (a, *_rest), r in zip(checked, results)]


def _run_batched(checked, out, stream, device, batch=None):
    """Plan the whole list as one launch and run it; with `batch` (the key and addresses of
    a batch that can be replayed, `_batch_key`), the run is kept when every item was used
    as given."""
    rows, outputs, ptrs, held = [], [], [], []
    as_given = True
    for i, (a, p, b, sym, g) in enumerate(checked):
        qc, pc = contiguous(a.data), _params_ready(p.data)
        as_given = as_given and qc is a.data and pc is p.data
        held.append((qc, pc))
        ptrs.append((qc.data.ptr, pc.data.ptr))
        shape = unpacked_shape(a.data.shape, b)
        n = math.prod(shape)
        okey = ("batch item", shape, out.name)
        o = _plans.get(okey)
        if o is None:
            o = _gpu.remember(_plans, okey, _gpu.Outputs((shape, out.numpy)))
        outputs.append(o)
        if n == 0:
            continue
        vec, units, d = dequant_units(n, g, b, out, qc, *([] if sym else [pc]))
        magic, shift = _gpu.fastdiv(d)
        kind = (1 if b == 4 else 0) | (2 if sym else 0) | (4 if vec > 2 else 0)
        rows.append((i, units, d, -(-units // (DQ_THREADS * DQ_UNROLL * BATCH_ROUNDS)),
                     int(magic) | (int(shift) << 32), kind))
    launch = None
    if rows:
        launch_key = ("batched", out.name, device)
        launch = _plans.get(launch_key)
        if launch is None:
            launch = _gpu.remember(_plans, launch_key, _gpu.Launch(
                _kernels.function(SRC, batched_expr(out), device), 2))
    run = BatchRun(tuple(outputs), tuple(rows), launch)
    if batch is not None and as_given and _fast.current_device() == device:
        _fast.keep(batch[0], run)
    # `held` keeps the copies made above (if any) alive until the launch is queued: freed
    # earlier, their memory could come back as this batch's outputs.
    results = run(stream, ptrs)
    del held
    return results


