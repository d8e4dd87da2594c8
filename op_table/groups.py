"""The group-wise families' declarations in the op table: DeepSpeed's format, INT4 per group,
batched dequantization and the zero point, with their inputs, shapes, variants and torch
baselines."""

from __future__ import annotations

import dataclasses

import numpy as np

import cuquant
from cuquant._core.validate import BITS

from .ops import BENCH_SHAPES, F, H, Op, float_input

GROUP_SIZES_SMALL = (1, 6, 24, 136, 128, 2048)   # all divide 104448 = 2**11 * 3 * 17
SHAPES_SMALL = ((51, 2048), (3, 4, 8704), (104448,), (2, 17, 3072))
LARGE_GROUPS = ((20000, ((3, 20000), (2, 5, 8000))), (65536, ((2, 65536), (4, 2, 16384))))
BENCH_GROUPS = (128, 2048)


def fit_shape(shape, group: int, even: bool, flat: bool = True) -> tuple:
    """`shape`, or, when `group` does not divide its size (flat) or its last axis, or the
    last axis is odd where it must be even, the shape with its last axis raised to the next
    multiple of lcm(group, 2 if even else 1): the generic GPU tests pass any shape."""
    shape = tuple(int(d) for d in shape) or (1,)
    size = int(np.prod(shape, dtype=np.int64))
    ok = (size if flat else shape[-1]) % group == 0 and not (even and shape[-1] % 2)
    if ok:
        return shape
    step = group * (2 if even and group % 2 else 1)
    return shape[:-1] + (max(step, -(-shape[-1] // step) * step),)


def _variants(groups, bits=BITS):
    return tuple({"bits": b, "symmetric": s, "group_size": g}
                 for g in groups for b in bits for s in (False, True))


def _make_quantize(xp, rng, shape, dtype, **kw):
    shape = fit_shape(shape, kw["group_size"], kw["bits"] == 4)
    return (float_input(xp, rng, shape, dtype),), kw


def _make_dequantize(xp, rng, shape, dtype, **kw):
    shape = fit_shape(shape, kw["group_size"], kw["bits"] == 4)
    q, params = cuquant.quantize_groupwise(float_input(xp, rng, shape, np.float32), **kw)
    return (q, params, kw["bits"], kw["symmetric"], kw["group_size"], dtype), {}


def _make_int4(xp, rng, shape, dtype, group_size=128):
    shape = fit_shape(shape if len(shape) == 2 else (1,) + tuple(shape)[-1:], group_size, True,
                      flat=False)
    return (float_input(xp, rng, shape, dtype),), {"group_size": group_size}


def _make_int4_dequant(xp, rng, shape, dtype, group_size=128):
    (w,), kw = _make_int4(xp, rng, shape, np.float32, group_size)
    q, params = cuquant.quantize_int4_per_group(w, **kw)
    return (q, params, dtype), kw


def batched_inputs(xp, rng, count: int, max_elems: int, *, mixed: bool = True):
    """`count` (q, params, bits, symmetric, group_size) items of max_elems / 4 to max_elems
    elements each, both bit widths and symmetries, group sizes 128, 256 and 2048 (and
    24, 136 and 6 when `mixed`)."""
    items = []
    groups = (128, 256, 2048) + ((24, 136, 6) if mixed else ())
    for i in range(count):
        g = groups[i % len(groups)]
        n = int(rng.integers(max(1, max_elems // 4), max_elems + 1))
        n = max(2 * g, (n // (2 * g)) * 2 * g)
        bits, sym = BITS[i % 2], bool((i // 2) % 2)
        x = float_input(xp, rng, (n // 64, 64) if n % 64 == 0 else (n,), np.float32)
        q, params = cuquant.quantize_groupwise(x, bits, sym, g)
        items.append((q, params, bits, sym, g))
    return items


def _one_call_per_item(args, kwargs):
    """The batched op's work as one dequantize_groupwise call per tensor."""
    items, dtype = args
    return lambda: [cuquant.dequantize_groupwise(*item, dtype) for item in items]


def _make_batched(xp, rng, shape, dtype, mixed=True):
    count, max_elems = shape[0], shape[-1]
    return (batched_inputs(xp, rng, count, max_elems, mixed=mixed), dtype), {}


def t_quantize_groupwise(x, bits, symmetric, group_size):
    """torch eager: the same math, not bit-exact (baseline only)."""
    import torch

    xf = x.float().reshape(-1, group_size)
    if symmetric:
        m = xf.abs().amax(dim=1, keepdim=True)
        mult = torch.where(m == 0, torch.ones_like(m), (2 ** bits) / (2 * m))
        offset = torch.zeros_like(m)
        params = 1 / mult
    else:
        hi, lo = xf.amax(dim=1, keepdim=True), xf.amin(dim=1, keepdim=True)
        mult = torch.where(hi == lo, torch.ones_like(hi), (2 ** bits) / (hi - lo))
        offset = (hi + lo) * 0.5
        params = torch.cat([1 / mult, offset], dim=1)
    q = ((xf - offset) * mult).round().clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    q = q.to(torch.int8).reshape(x.shape)
    if bits == 4:
        q = ((q[..., 0::2] << 4) | (q[..., 1::2] & 0xF)).to(torch.int8)
    return q, params


def t_dequantize_groupwise(q, params, bits, symmetric, group_size, dtype):
    import torch

    if bits == 4:
        q = torch.stack([q >> 4, (q << 4).to(torch.int8) >> 4], dim=-1).reshape(*q.shape[:-1], -1)
    y = q.float().reshape(-1, group_size) * params[:, :1]
    if not symmetric:
        y = y + params[:, 1:2]
    return y.to(dtype).reshape(q.shape)


def t_int4_per_group(w, group_size=128):
    return t_quantize_groupwise(w, 4, False, group_size)


def t_int4_dequant(packed, params, dtype, group_size=128):
    return t_dequantize_groupwise(packed, params, 4, False, group_size, dtype)


def _groupwise_ops() -> list[Op]:
    fam = "groupwise"
    ops = []
    for bits, target in ((8, 0.92), (4, 0.90)):
        ops.append(Op("quantize_groupwise", fam, "quantize", F, _make_quantize,
                      variants=_variants(GROUP_SIZES_SMALL, (bits,)), shapes=SHAPES_SMALL,
                      bench_variants=_variants(BENCH_GROUPS, (bits,)), target=target,
                      torch_ref=t_quantize_groupwise, notes=f"{bits}-bit"))
    ops.append(Op("dequantize_groupwise", fam, "dequantize", F, _make_dequantize,
                  variants=_variants(GROUP_SIZES_SMALL), shapes=SHAPES_SMALL,
                  bench_variants=_variants(BENCH_GROUPS), target=0.93,
                  torch_ref=t_dequantize_groupwise))
    for g, shapes in LARGE_GROUPS:
        for fn, make, kind in (("quantize_groupwise", _make_quantize, "quantize"),
                               ("dequantize_groupwise", _make_dequantize, "dequantize")):
            ops.append(Op(fn, fam, kind, F, make, variants=_variants((g,)), shapes=shapes,
                          bench_shapes=(), bench_variants=(),
                          notes=f"group_size {g}, above DeepSpeed's 16384"))
    int4_shapes = ((1, 256), (7, 512), (64, 7168), (130, 4096))
    int4_variants = tuple({"group_size": g} for g in (32, 64, 128, 256, 6))
    ops.append(Op("quantize_int4_per_group", fam, "quantize", F, _make_int4,
                  variants=int4_variants, shapes=int4_shapes, bench_shapes=BENCH_SHAPES,
                  bench_variants=({"group_size": 128},), target=0.90, torch_ref=t_int4_per_group))
    ops.append(Op("dequantize_int4_per_group", fam, "dequantize", F, _make_int4_dequant,
                  variants=int4_variants, shapes=int4_shapes, bench_shapes=BENCH_SHAPES,
                  bench_variants=({"group_size": 128},), target=0.93, torch_ref=t_int4_dequant))
    ops.append(Op("dequantize_groupwise_batched", fam, "dequantize", F, _make_batched,
                  shapes=((5, 4096), (12, 70000)), bench_shapes=((64, 4 << 20),),
                  bench_variants=({"mixed": False},), target=0.93,
                  notes="shape = (tensors, max elements a tensor); the bench moves 64 "
                        "tensors of 1-4 MB of codes in one launch",
                  alternative=_one_call_per_item, alternative_name="one call per tensor"))
    return ops


# ---------------------------------------------------------------------------------------
# The zero point

ZP_SHAPES = ((1, 768), (7, 1536), (64, 7680), (130, 4608), (3, 768))   # K % 768 == 0


def _fit(shape, kw):
    shape = tuple(shape) if len(shape) == 2 else (1,) + (tuple(shape)[-1:] or (1,))
    return fit_shape(shape, kw.get("group_size", 128), kw.get("bits", 4) == 4, flat=False)


def stochastic_words(xp, rng, shape, kw) -> dict:
    """kw with rbits= or seed= for a stochastic variant, by its "source" key ("rbits", else
    a seed); the key itself taken out."""
    kw = dict(kw)
    source = kw.pop("source", "seed")
    if kw.get("rounding") == "stochastic":
        if source == "rbits":
            words = rng.integers(0, 1 << 32, size=shape, dtype=np.uint32)
            kw["rbits"] = words if xp is np else xp.asarray(words)
        else:
            kw["seed"] = int(rng.integers(1 << 62))
    return kw


def _make_zp_quantize(xp, rng, shape, dtype, **kw):
    shape = _fit(shape, kw)
    x = float_input(xp, rng, shape, dtype)
    return (x,), stochastic_words(xp, rng, shape, kw)


def _make_zp_dequantize(xp, rng, shape, dtype, source_dtype="float16", **kw):
    x = float_input(xp, rng, _fit(shape, kw), source_dtype)
    q, scales, zeros, _ = cuquant.quantize_groupwise_zero_point(x, **kw)
    return (q, scales, zeros, kw.get("group_size", 128), dtype), {}


def t_quantize_zero_point(x, bits=4, group_size=128, rounding="nearest", rbits=None, seed=None,
                          symmetric=False):
    """torch eager: nearest rounding, not bit-exact (baseline only)."""
    import torch

    m, k = x.shape
    xf = x.float().reshape(m, k // group_size, group_size)
    hi, lo = xf.amax(dim=-1, keepdim=True), xf.amin(dim=-1, keepdim=True)
    qmax = 2 ** bits - 1
    if symmetric:
        s = (torch.maximum(hi.abs(), lo.abs()).clamp_min(1e-5) / (qmax / 2)).to(x.dtype).float()
        z = torch.full_like(s, 2 ** (bits - 1))
    else:
        s = ((hi - lo).clamp_min(1e-5) / qmax).to(x.dtype).float()
        z = (-lo / s).round().clamp(0, qmax)
    q = ((xf / s).round() + z).clamp(0, qmax)
    deq = ((q - z) * s).to(x.dtype).reshape(m, k)
    q = q.to(torch.uint8).reshape(m, k)
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    return q, s.to(x.dtype).reshape(m, -1), z.to(x.dtype).reshape(m, -1), deq


def t_dequantize_zero_point(q, scales, zeros, group_size, dtype):
    import torch

    if q.shape[1] * 2 == scales.shape[1] * group_size:
        q = torch.stack([q & 0xF, q >> 4], dim=-1).reshape(q.shape[0], -1)
    m, k = q.shape
    y = (q.float().reshape(m, -1, group_size) - zeros.float().unsqueeze(-1)) \
        * scales.float().unsqueeze(-1)
    return y.to(dtype).reshape(m, k)


def _zero_point_ops() -> list[Op]:
    fam = "zero_point"
    groups = (32, 64, 128, 256, 6, 3)
    ops = []
    for bits, target in ((4, 0.90), (8, 0.92)):
        variants = tuple({"bits": bits, "group_size": g, "rounding": "nearest"} for g in groups)
        variants += tuple({"bits": bits, "group_size": g, "rounding": "stochastic", "source": src}
                          for g in (32, 64, 128, 256, 6) for src in ("seed", "rbits"))
        variants += tuple({"bits": bits, "group_size": g, "rounding": "nearest", "symmetric": True}
                          for g in groups)
        variants += tuple({"bits": bits, "group_size": g, "rounding": "stochastic", "source": src,
                           "symmetric": True} for g in (128, 6) for src in ("seed", "rbits"))
        ops.append(Op("quantize_groupwise_zero_point", fam, "quantize", H, _make_zp_quantize,
                      variants=variants, shapes=ZP_SHAPES,
                      bench_variants=tuple({"bits": bits, "group_size": 128, "rounding": r}
                                           for r in ("nearest", "stochastic"))
                      + ({"bits": bits, "group_size": 128, "rounding": "nearest",
                          "symmetric": True},),
                      target=target, torch_ref=t_quantize_zero_point,
                      notes=f"{bits}-bit; stochastic draws Philox4x32-10 words in the kernel"))
    ops.append(Op("dequantize_groupwise_zero_point", fam, "dequantize", F, _make_zp_dequantize,
                  variants=tuple({"bits": b, "group_size": g, "source_dtype": sd}
                                 for b in BITS for g in (128, 32, 256, 6) for sd in H),
                  shapes=ZP_SHAPES, bench_shapes=BENCH_SHAPES,
                  bench_variants=tuple({"bits": b, "group_size": 128} for b in BITS),
                  target=0.93, torch_ref=t_dequantize_zero_point))
    return ops


# The benchmark times group-wise ops at float16 (formats.md section 8).
OPS: list[Op] = [dataclasses.replace(op, bench_dtype="float16")
                 for op in _groupwise_ops() + _zero_point_ops()]

__all__ = ["OPS", "fit_shape", "batched_inputs"]
