"""DeepSpeed's group-wise format on the GPU (cuda_src/groupwise.cu): its format policies
in the shared group-wise kernel families, its outputs, and the batched dequantizer."""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._core import replay as _fast
from .._core.arrays import contiguous, cupy_module, outcome, require_cupy
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


class BatchRun:
    """One batched dequantization from the stream and each item's (q, params) addresses:
    each item's output allocated, the table of items (fixed fields kept, addresses filled
    in) copied to the device, one launch. The whole way runs it, and the replay cache keeps it
    as the replay of repeated batches."""

    __slots__ = ("outputs", "rows", "launch", "blocks")

    def __init__(self, outputs, rows, launch, blocks):
        # outputs: (shape, scalar type, bytes, row or -1) per item; rows: the table's rows
        # with 0 for the addresses.
        self.outputs, self.rows, self.launch, self.blocks = outputs, rows, launch, blocks

    def __call__(self, stream, ptrs):
        cp = cupy_module()
        alloc, nd = cp.cuda.alloc, cp.ndarray
        results, table = [], list(self.rows)
        for (shape, typ, nbytes, row), (qp, pp) in zip(self.outputs, ptrs):
            res = nd(shape, typ, alloc(nbytes))
            results.append(res)
            if row >= 0:
                table[row] = (qp, pp, res.data.ptr) + table[row][3:]
        if table:
            t = cp.asarray(np.array(table, dtype=np.uint64).view(np.int64))
            self.launch(self.blocks, 256, stream, (t.data.ptr, len(table)))
        return results


def batched(checked, out: FloatType, stream, batch=None):
    cp = require_cupy("dequantize_groupwise_batched")
    device = checked[0][0].device
    if stream is None and checked[0][0].family == "torch":  # torch's current stream
        stream = _gpu.torch_stream(device, _gpu.torch_stream_ptr(device)).cupy()
    with cp.cuda.Device(device):
        if stream is None:
            results = _run_batched(checked, out, cp.cuda.get_current_stream(), device, batch)
        else:
            with stream:
                results = _run_batched(checked, out, stream, device)
    return [outcome(a, r) for (a, *_rest), r in zip(checked, results)]


def _run_batched(checked, out, stream, device, batch=None):
    """Plan the whole list as one launch and run it; with `batch` (the key and addresses of
    a batch that can be replayed, `_batch_key`), the run is kept when every item was used
    as given."""
    rows, outputs, ptrs, held = [], [], [], []
    block = 0
    as_given = True
    for a, p, b, sym, g in checked:
        qc, pc = contiguous(a.data), _params_ready(p.data)
        as_given = as_given and qc is a.data and pc is p.data
        held.append((qc, pc))
        ptrs.append((qc.data.ptr, pc.data.ptr))
        shape = unpacked_shape(a.data.shape, b)
        n = math.prod(shape)
        outputs.append((shape, out.numpy.type, n * out.numpy.itemsize, len(rows) if n else -1))
        if n == 0:
            continue
        vec, units, d = dequant_units(n, g, b, out, qc, *([] if sym else [pc]))
        magic, shift = _gpu.fastdiv(d)
        kind = (1 if b == 4 else 0) | (2 if sym else 0) | (4 if vec > 2 else 0)
        rows.append((0, 0, 0, units, d, block, int(magic) | (int(shift) << 32), kind))
        block += -(-units // (DQ_THREADS * DQ_UNROLL * BATCH_ROUNDS))
    launch = None
    if rows:
        launch_key = ("batched", out.name, device)
        launch = _plans.get(launch_key)
        if launch is None:
            launch = _gpu.remember(_plans, launch_key, _gpu.Launch(
                _kernels.function(SRC, batched_expr(out), device), 2))
    run = BatchRun(tuple(outputs), tuple(rows), launch, block)
    if batch is not None and as_given and _fast.current_device() == device:
        _fast.keep(batch[0], run)
    # `held` keeps the copies made above (if any) alive until the launch is queued: freed
    # earlier, their memory could come back as this batch's outputs.
    results = run(stream, ptrs)
    del held
    return results


