"""The INT8 and FP8 families' declarations in the op table, with their inputs and their
torch and CuPy baselines."""

from __future__ import annotations

import numpy as np

import cuquant

from cuquant._core.dtypes import FLOATS

from .ops import TEST_SHAPES_2D, F, Op, float_input



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
       variants=({}, {"scale_format": "ue8m0"}),
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
       _codes_of(cuquant.quantize_fp8_per_block), target=0.93,
       variants=({}, {"scale_format": "ue8m0"}), torch_ref=t_dequant_block),
]




__all__ = ["OPS", "QUANTIZE_ONLY"]
