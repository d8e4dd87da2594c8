"""One declaration per public op: its dtypes, the variants and shapes to test and to
benchmark, how to make realistic inputs, the bytes it moves, and the baseline expressions
(torch eager / torch.compile / naive CuPy) to compare against. The GPU tests and the
benchmark both enumerate `OPS`, so a new op cannot skip either.

Inputs are made with an array module `xp` (NumPy or CuPy) so that benchmarks generate
large inputs on the device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

import cuquant
from cuquant._dtypes import FLOATS

BENCH_SHAPES = ((1, 4096), (16, 4096), (128, 7168), (4096, 7168), (16384, 7168))
SMALL_SHAPES = ((1, 4096), (16, 4096), (128, 7168))
HEADLINE = (16384, 7168)

TEST_SHAPES_2D = ((1, 1), (3, 5), (7, 128), (37, 999), (64, 7168), (130, 257), (256, 4096),
                  (5, 16400), (2, 70000))


@dataclass(frozen=True)
class Op:
    name: str
    family: str
    kind: str                        # "quantize" or "dequantize"
    dtypes: tuple                    # input dtypes (quantizers) / output dtypes (dequantizers)
    make: Callable                   # make(xp, rng, shape, dtype, **variant) -> (args, kwargs)
    variants: tuple = ({},)
    shapes: tuple = TEST_SHAPES_2D
    bench_shapes: tuple = BENCH_SHAPES
    bench_variants: tuple = ({},)
    target: float = 0.92             # fraction of copy bandwidth at HEADLINE (SPEC section 8)
    moved: Callable | None = None    # bytes really moved, where it differs from in + out
    torch_ref: Callable | None = None
    cupy_ref: Callable | None = None
    notes: str = ""
    fp8_outputs: tuple = field(default=())
    bench_dtype: str | None = None   # the benchmark's input dtype (default bfloat16)
    # The same work done another way (alternative(args, kwargs) -> a callable), timed
    # beside the op by the benchmark, e.g. a batched call against one call per tensor.
    alternative: Callable | None = None
    alternative_name: str = ""

    @property
    def fn(self):
        return getattr(cuquant, self.name)


# ---------------------------------------------------------------------------------------
# Inputs

def float_input(xp, rng, shape, dtype, *, scale_rows=True):
    """Weights-like data: normal, rows at different scales, a few outliers. `rng` is a
    NumPy Generator (its seed drives CuPy's generator too)."""
    seed = int(rng.integers(1 << 31))
    g = xp.random.default_rng(seed)
    x = g.standard_normal(size=shape, dtype=np.float32)
    if scale_rows and len(shape) >= 2 and x.size:
        rows = g.uniform(-3.0, 1.0, size=shape[:-1] + (1,)).astype(np.float32)
        x = x * (10.0 ** rows)
        flat = x.reshape(-1)
        k = max(1, flat.size // 997)
        idx = g.integers(0, flat.size, size=k)
        flat[idx] = flat[idx] * 40.0
    return x.astype(FLOATS[np.dtype(dtype).name if not isinstance(dtype, str) else dtype].numpy)


def _x(xp, rng, shape, dtype, **kw):
    if kw.get("scale_dtype") == "input":  # scales stored in the input's own dtype
        kw = dict(kw, scale_dtype=np.dtype(FLOATS[str(dtype)].numpy).name)
    return (float_input(xp, rng, shape, dtype),), kw


def _smooth(xp, rng, shape, dtype, **kw):
    x = float_input(xp, rng, shape, dtype)
    g = xp.random.default_rng(int(rng.integers(1 << 31)))
    smooth = g.uniform(0.25, 4.0, size=(shape[-1],)).astype(np.float32)
    return (x, smooth), kw


def _static(xp, rng, shape, dtype, **kw):
    x = float_input(xp, rng, shape, dtype)
    return (x,), dict(kw, scale=0.0123)


QUANTIZE_ONLY = ("scale_layout", "scale_format")


def _codes_of(quantize):
    """Dequantizer inputs: codes and scales made by the matching quantizer; variant keys
    in QUANTIZE_ONLY shape the scales and are not passed to the dequantizer."""
    def make(xp, rng, shape, dtype, **kw):
        x = float_input(xp, rng, shape, np.float32)
        q, s = quantize(x, **kw)
        return (q, s, dtype), {k: v for k, v in kw.items() if k not in QUANTIZE_ONLY}
    return make


# ---------------------------------------------------------------------------------------
# Baselines: the same math as plain framework expressions

def _torch():
    import torch

    return torch


def t_int8_rows(x):
    torch = _torch()
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
    return (xf / s).round().clamp(-127, 127).to(torch.int8), s


def t_int8_tensor(x):
    torch = _torch()
    xf = x.float()
    amax = xf.abs().amax()
    s = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
    return (xf / s).round().clamp(-127, 127).to(torch.int8), s


def t_int8_block(x, block_size=128):
    xf = x.float().view(x.shape[0], -1, block_size)
    amax = xf.abs().amax(dim=-1, keepdim=True)
    torch = _torch()
    s = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
    return (xf / s).round().clamp(-127, 127).to(torch.int8).view(x.shape), s


def t_smooth(x, smooth):
    return t_int8_rows(x.float() / smooth)


def t_fp8_tensor(x):
    torch = _torch()
    xf = x.float()
    amax = xf.abs().amax()
    s = torch.where(amax == 0, torch.ones_like(amax), amax / 448)
    return (xf / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def t_fp8_rows(x):
    torch = _torch()
    xf = x.float()
    s = xf.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4) / 448
    return (xf / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def t_fp8_group(x, group_size=128):
    torch = _torch()
    xf = x.float().view(x.shape[0], -1, group_size)
    s = xf.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4) / 448
    return (xf / s).clamp(-448, 448).to(torch.float8_e4m3fn).view(x.shape), s


def _tiles(t):
    """A 2-D tensor as [N/128, 128, K/128, 128] tiles, padded with zeros to whole tiles
    (a zero adds nothing to a tile's amax)."""
    n, k = t.shape
    if n % 128 or k % 128:
        t = _torch().nn.functional.pad(t, (0, -k % 128, 0, -n % 128))
    return t.view(t.shape[0] // 128, 128, t.shape[1] // 128, 128)


def _untiled(tiles, n, k):
    """Tiles back to the [n, k] tensor they were made from."""
    nb, _, kb, _ = tiles.shape
    return tiles.reshape(nb * 128, kb * 128)[:n, :k]


def t_fp8_block(w):
    torch = _torch()
    wf = _tiles(w.float())
    amax = wf.abs().amax(dim=(1, 3), keepdim=True)
    s = torch.where(amax == 0, torch.ones_like(amax), amax / 448)
    q = (wf / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    return _untiled(q, *w.shape), s.view(wf.shape[0], wf.shape[2])


def t_dequant_rows(q, s, dtype):
    return (q.float() * s.reshape(-1, 1)).to(dtype)


def t_dequant_tensor(q, s, dtype):
    return (q.float() * s).to(dtype)


def t_dequant_group(q, s, dtype, group_size=128):
    return (q.float().view(q.shape[0], -1, group_size) * s.unsqueeze(-1)).to(dtype).view(q.shape)


def t_dequant_int8_block(q, s, dtype, block_size=128):
    return t_dequant_group(q, s, dtype, group_size=block_size)


def t_dequant_block(q, s, dtype):
    qf = _tiles(q.float())
    return _untiled((qf * s.view(qf.shape[0], 1, qf.shape[2], 1)).to(dtype), *q.shape)


def c_int8_rows(x):
    import cupy as cp

    xf = x.astype(cp.float32)
    amax = cp.abs(xf).max(axis=-1, keepdims=True)
    s = cp.where(amax == 0, cp.float32(1), amax * cp.float32(1 / 127))
    return cp.clip(cp.rint(xf / s), -127, 127).astype(cp.int8), s


def c_dequant_rows(q, s, dtype):
    import cupy as cp

    return (q.astype(cp.float32) * s.reshape(-1, 1)).astype(dtype)


# ---------------------------------------------------------------------------------------
# The declarations

F = ("float16", "bfloat16", "float32")
H = ("float16", "bfloat16")


def _two_reads(args, kwargs, outputs):
    x = args[0]
    return 2 * x.nbytes + sum(o.nbytes for o in outputs)


OPS: list[Op] = [
    Op("quantize_int8_per_tensor", "int8", "quantize", F, _x, target=0.85, moved=_two_reads,
       shapes=TEST_SHAPES_2D + ((3, 4, 5), (4096,), ()), torch_ref=t_int8_tensor),
    Op("quantize_int8_per_tensor", "int8", "quantize", F, _static, notes="static scale",
       torch_ref=None),
    Op("quantize_int8_per_channel", "int8", "quantize", F, _x, torch_ref=t_int8_rows,
       cupy_ref=c_int8_rows, variants=({}, {"scale_dtype": "input"})),
    Op("quantize_int8_per_block", "int8", "quantize", F, _x,
       variants=tuple({"block_size": b} for b in (32, 64, 128, 256)),
       bench_variants=({"block_size": 128},), torch_ref=t_int8_block),
    Op("smooth_quant", "int8", "quantize", F, _smooth, torch_ref=t_smooth),
    Op("dequantize_int8_per_tensor", "int8", "dequantize", F,
       _codes_of(cuquant.quantize_int8_per_tensor), target=0.93, torch_ref=t_dequant_tensor),
    Op("dequantize_int8_per_channel", "int8", "dequantize", F,
       _codes_of(cuquant.quantize_int8_per_channel), target=0.93, torch_ref=t_dequant_rows,
       cupy_ref=c_dequant_rows),
    Op("dequantize_int8_per_block", "int8", "dequantize", F,
       _codes_of(cuquant.quantize_int8_per_block), target=0.93,
       variants=tuple({"block_size": b} for b in (32, 64, 128, 256)),
       bench_variants=({"block_size": 128},), torch_ref=t_dequant_int8_block),
    Op("quantize_fp8_per_tensor", "fp8", "quantize", F, _x, target=0.85, moved=_two_reads,
       shapes=TEST_SHAPES_2D + ((3, 4, 5), (4096,), ()), torch_ref=t_fp8_tensor,
       fp8_outputs=(0,)),
    Op("quantize_fp8_per_tensor", "fp8", "quantize", F, _static, notes="static scale",
       fp8_outputs=(0,)),
    Op("quantize_fp8_per_row", "fp8", "quantize", F, _x, variants=({}, {"scale_dtype": "input"}),
       shapes=TEST_SHAPES_2D + ((2, 3, 4, 64), (3, 0)), torch_ref=t_fp8_rows, fp8_outputs=(0,)),
    Op("quantize_fp8_per_token_group", "fp8", "quantize", F, _x,
       variants=tuple({"group_size": g, "scale_layout": lay, "scale_format": fmt}
                      for g in (32, 64, 128, 256) for lay in ("row", "column")
                      for fmt in ("float32", "ue8m0")),
       bench_variants=({"group_size": 128},), torch_ref=t_fp8_group, fp8_outputs=(0,)),
    Op("quantize_fp8_per_block", "fp8", "quantize", F, _x,
       shapes=TEST_SHAPES_2D + ((128, 128), (576, 7168), (129, 1)), torch_ref=t_fp8_block,
       fp8_outputs=(0,)),
    Op("dequantize_fp8_per_tensor", "fp8", "dequantize", F,
       _codes_of(cuquant.quantize_fp8_per_tensor), target=0.93, torch_ref=t_dequant_tensor),
    Op("dequantize_fp8_per_row", "fp8", "dequantize", F,
       _codes_of(cuquant.quantize_fp8_per_row), target=0.93, torch_ref=t_dequant_rows),
    Op("dequantize_fp8_per_token_group", "fp8", "dequantize", F,
       _codes_of(cuquant.quantize_fp8_per_token_group), target=0.93,
       variants=tuple({"group_size": g, "scale_layout": lay} for g in (32, 64, 128, 256)
                      for lay in ("row", "column")),
       bench_variants=({"group_size": 128},), torch_ref=t_dequant_group),
    Op("dequantize_fp8_per_block", "fp8", "dequantize", F,
       _codes_of(cuquant.quantize_fp8_per_block), target=0.93, torch_ref=t_dequant_block),
]


def declared_names() -> set[str]:
    return {op.name for op in OPS}


def extend(ops, bench_dtype: str | None = None) -> None:
    """Families declared in their own modules add themselves here."""
    for op in ops:
        OPS.append(dataclasses.replace(op, bench_dtype=bench_dtype) if bench_dtype else op)


_LOADED = False


def all_ops() -> list[Op]:
    """Every declaration, the later families' included."""
    global _LOADED
    if not _LOADED:
        from . import groupwise, zero_point  # noqa: F401 - they call extend()

        _LOADED = True
    return OPS


__all__ = ["Op", "OPS", "all_ops", "extend", "float_input", "BENCH_SHAPES", "SMALL_SHAPES",
           "HEADLINE", "TEST_SHAPES_2D", "F", "H", "ml_dtypes"]
