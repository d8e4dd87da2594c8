"""The microscaling formats' declarations in the op table (MXFP8, MXFP4, NVFP4), with their
inputs and torch baselines (the same math as plain torch expressions, not bit-exact)."""

from __future__ import annotations

import numpy as np

import cuquant

from .groups import stochastic_words
from .ops import TEST_SHAPES_2D, F, Op, float_input

SHAPES = TEST_SHAPES_2D + ((128, 7168), (257, 96), (300, 48))


def fit(shape, block: int) -> tuple:
    """A 2-D shape whose K is a multiple of `block` (raised to the next one)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 2:
        shape = (int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1,
                 shape[-1] if shape else 1)
    m, k = shape
    return (m, max(block, -(-k // block) * block))


def _quantize(block):
    def make(xp, rng, shape, dtype, **kw):
        shape = fit(shape, block)
        return (float_input(xp, rng, shape, dtype),), stochastic_words(xp, rng, shape, kw)
    return make


QUANTIZE_ONLY = ("scale_mode", "scale_layout", "rounding", "source", "global_amax")


def _dequantize(quantize, block):
    """Dequantizer inputs made by the matching quantizer; the variant's keys shape them."""
    def make(xp, rng, shape, dtype, **kw):
        shape = fit(shape, block)
        x = float_input(xp, rng, shape, np.float32)
        out = quantize(x, **stochastic_words(xp, rng, shape, kw))
        return tuple(out) + (dtype,), {k: v for k, v in kw.items() if k not in QUANTIZE_ONLY}
    return make


def _two_reads(args, kwargs, outputs):
    """NVFP4 without a global amax reads x twice (amax, then codes) where it does not fit
    on chip."""
    return 2 * args[0].nbytes + sum(a.nbytes for a in kwargs.values() if hasattr(a, "nbytes")) \
        + sum(o.nbytes for o in outputs)


# ---------------------------------------------------------------------------------------
# Baselines

def _torch():
    import torch

    return torch


def _e8m0_rceil(amax, fmt_max):
    torch = _torch()
    d = amax / fmt_max
    e = torch.ceil(torch.log2(d.clamp_min(2.0 ** -127))).clamp(-127, 127)
    return e


def _e2m1(v):
    """Round to nearest on the e2m1 grid (torch ops; ties as the grid bounds say)."""
    torch = _torch()
    a = v.abs()
    mag = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5)
           + (a >= 3.5) + (a > 5.0))
    return mag | ((v < 0).to(torch.uint8) << 3)


def _pack(codes):
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def t_quantize_mxfp8(x, scale_mode="rceil", scale_layout="row"):
    torch = _torch()
    m, k = x.shape
    xb = x.float().view(m, k // 32, 32)
    e = _e8m0_rceil(xb.abs().amax(dim=-1, keepdim=True), 448.0)
    q = (xb * torch.exp2(-e)).clamp(-448, 448).to(torch.float8_e4m3fn).view(m, k)
    return q, (e + 127).to(torch.uint8).view(m, -1)


def t_quantize_mxfp4(x, scale_mode="rceil", scale_layout="row", rounding="nearest",
                     rbits=None, seed=None):
    torch = _torch()
    m, k = x.shape
    xb = x.float().view(m, k // 32, 32)
    e = _e8m0_rceil(xb.abs().amax(dim=-1, keepdim=True), 6.0)
    codes = _e2m1((xb * torch.exp2(-e)).view(m, k))
    return _pack(codes), (e + 127).to(torch.uint8).view(m, -1)


def t_quantize_nvfp4(x, global_amax=None, scale_layout="row", rounding="nearest", rbits=None,
                     seed=None):
    torch = _torch()
    m, k = x.shape
    xf = x.float()
    a = xf.abs().amax() if global_amax is None else torch.tensor(global_amax, device=x.device)
    enc = torch.where(a == 0, torch.ones_like(a), (2688.0 / a).clamp_max(3.4028234663852886e38))
    xb = xf.view(m, k // 16, 16)
    s = (xb.abs().amax(dim=-1, keepdim=True) * (enc / 6)).clamp_max(448).to(torch.float8_e4m3fn)
    r = (1.0 / (s.float() / enc)).clamp_max(3.4028234663852886e38)
    return _pack(_e2m1((xb * r).view(m, k))), s.view(m, -1), a.reshape(1)


def _e2m1_values(packed):
    torch = _torch()
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0,
                         -3.0, -4.0, -6.0], device=packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).view(packed.shape[0], -1)
    return grid[codes.long()]


def t_dequantize_mxfp8(q, scales, dtype):
    torch = _torch()
    m, k = q.shape
    qf = q.view(torch.float8_e4m3fn).float().view(m, k // 32, 32)
    s = torch.exp2(scales.view(torch.uint8).float() - 127).view(m, -1, 1)
    return (qf * s).to(dtype).view(m, k)


def t_dequantize_mxfp4(q, scales, dtype):
    torch = _torch()
    v = _e2m1_values(q.view(torch.uint8))
    m, k = v.shape
    s = torch.exp2(scales.view(torch.uint8).float() - 127).view(m, -1, 1)
    return (v.view(m, k // 32, 32) * s).to(dtype).view(m, k)


def t_dequantize_nvfp4(q, scales, global_amax, dtype):
    torch = _torch()
    v = _e2m1_values(q.view(torch.uint8))
    m, k = v.shape
    enc = torch.where(global_amax == 0, torch.ones_like(global_amax), 2688.0 / global_amax)
    s = (scales.view(torch.float8_e4m3fn).float() / enc).view(m, -1, 1)
    return (v.view(m, k // 16, 16) * s).to(dtype).view(m, k)


# ---------------------------------------------------------------------------------------
# The declarations

_MODES_LAYOUTS = tuple({"scale_mode": sm, "scale_layout": lay}
                       for sm in ("rceil", "floor") for lay in ("row", "swizzled"))
_FP4_WORDS = tuple({"rounding": "stochastic", "source": "rbits", "scale_layout": lay}
                   for lay in ("row", "swizzled"))
_SEEDED = ({"rounding": "stochastic", "source": "seed"},
           {"rounding": "stochastic", "source": "seed", "scale_layout": "swizzled"})
_NV_LAYOUTS = tuple({"scale_layout": lay} for lay in ("row", "swizzled"))
_STATIC = tuple({"global_amax": 3.0, "scale_layout": lay} for lay in ("row", "swizzled"))

OPS: list[Op] = [
    Op("quantize_mxfp8", "microscaling", "quantize", F, _quantize(32), variants=_MODES_LAYOUTS,
       shapes=SHAPES, bench_variants=({}, {"scale_layout": "swizzled"}), target=0.92,
       torch_ref=t_quantize_mxfp8),
    Op("quantize_mxfp4", "microscaling", "quantize", F, _quantize(32),
       variants=_MODES_LAYOUTS + _FP4_WORDS, shapes=SHAPES,
       bench_variants=({}, {"rounding": "stochastic", "source": "rbits"}), target=0.90,
       torch_ref=t_quantize_mxfp4),
    Op("quantize_mxfp4", "microscaling", "quantize", F, _quantize(32), variants=_SEEDED,
       shapes=SHAPES, bench_variants=_SEEDED[:1], target=0.70, notes="seeded stochastic"),
    Op("quantize_nvfp4", "microscaling", "quantize", F, _quantize(16),
       variants=_NV_LAYOUTS + _FP4_WORDS, shapes=SHAPES, bench_variants=({},), target=0.90,
       moved=_two_reads, torch_ref=t_quantize_nvfp4, notes="tensor amax"),
    Op("quantize_nvfp4", "microscaling", "quantize", F, _quantize(16), variants=_STATIC,
       shapes=SHAPES, bench_variants=_STATIC[:1], target=0.90, torch_ref=t_quantize_nvfp4,
       notes="static global amax"),
    Op("quantize_nvfp4", "microscaling", "quantize", F, _quantize(16), variants=_SEEDED,
       shapes=SHAPES, bench_variants=({"rounding": "stochastic", "source": "seed",
                                       "global_amax": 3.0},),
       target=0.70, notes="seeded stochastic"),
    Op("dequantize_mxfp8", "microscaling", "dequantize", F,
       _dequantize(cuquant.quantize_mxfp8, 32), variants=_MODES_LAYOUTS, shapes=SHAPES,
       target=0.93, torch_ref=t_dequantize_mxfp8),
    Op("dequantize_mxfp4", "microscaling", "dequantize", F,
       _dequantize(cuquant.quantize_mxfp4, 32), variants=_MODES_LAYOUTS, shapes=SHAPES,
       target=0.93, torch_ref=t_dequantize_mxfp4),
    Op("dequantize_nvfp4", "microscaling", "dequantize", F,
       _dequantize(cuquant.quantize_nvfp4, 16), variants=_NV_LAYOUTS, shapes=SHAPES,
       target=0.93, torch_ref=t_dequantize_nvfp4),
]

__all__ = ["OPS", "fit"]
