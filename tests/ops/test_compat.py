"""The TileOPs- and DeepSpeed-style entry points: each call equals the cuquant function it
wraps (CPU), and on a GPU the TileOPs torch reference expressions, written out here as the
TileOPs documentation states them, match bit for bit with torch tensors in and out."""

import ml_dtypes
import numpy as np
import pytest

import cuquant as cq
from _util import assert_same_bits
from cuquant.compat import deepspeed as ds
from cuquant.compat import tileops as to

BF16 = ml_dtypes.bfloat16


def _x(rng, shape, dtype=np.float16):
    return (rng.standard_normal(shape) * rng.uniform(0.1, 10)).astype(dtype)


def test_tileops_ops_equal_native(rng):
    x = _x(rng, (64, 384), BF16)
    smooth = rng.uniform(0.5, 2, 384).astype(np.float32)
    cases = [
        (to.INT8QuantPerTensorFwdOp(), (x,), cq.quantize_int8_per_tensor(x)),
        (to.INT8QuantPerChannelFwdOp(target=None), (x,), cq.quantize_int8_per_channel(x)),
        (to.INT8QuantPerBlockFwdOp(target=to.BUILTIN), (x,), cq.quantize_int8_per_block(x, 128)),
        (to.SmoothQuantFwdOp(), (x, smooth), cq.smooth_quant(x, smooth)),
        (to.FP8QuantPerBlockFwdOp(), (x,), cq.quantize_fp8_per_block(x)),
        (to.INT4QuantPerGroupFwdOp(group_size=64), (x,), cq.quantize_int4_per_group(x, 64)),
    ]
    for op, args, want in cases:
        got = op(*args)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_bits(g, w, type(op).__name__)
    x4 = _x(rng, (2, 3, 4, 128), BF16)
    scale, q = to.FP8QuantFwdOp()(x4)          # the scale first, as TileOPs returns it
    wq, ws = cq.quantize_fp8_per_row(x4)
    assert scale.shape == (2, 3, 4)
    assert_same_bits(scale, ws)
    assert_same_bits(q, wq)


def test_tileops_dequant_ops_equal_native(rng):
    x = _x(rng, (16, 300))
    for op_cls, quant, deq in [
        (to.INT8DequantPerTensorFwdOp, cq.quantize_int8_per_tensor, cq.dequantize_int8_per_tensor),
        (to.INT8DequantPerChannelFwdOp, cq.quantize_int8_per_channel, cq.dequantize_int8_per_channel),
        (to.INT8DequantPerBlockFwdOp, cq.quantize_int8_per_block, cq.dequantize_int8_per_block),
    ]:
        q, s = quant(x)
        for out in (np.float16, BF16, np.float32):
            assert_same_bits(op_cls(out)(q, s), deq(q, s, out), op_cls.__name__)


def test_tileops_refuses_other_targets():
    with pytest.raises(ValueError, match="target"):
        to.INT8QuantPerChannelFwdOp(target="triton")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("qtype", [ds.QuantizationType.Symmetric, ds.QuantizationType.Asymmetric])
def test_deepspeed_calls_equal_native(rng, bits, qtype):
    x = _x(rng, (8, 6, 96), BF16)
    groups = 24
    q, params = ds.quantize(x, groups, bits, qtype)
    sym = qtype == ds.QuantizationType.Symmetric
    wq, wp = cq.quantize_groupwise(x, bits, sym, x.size // groups)
    assert_same_bits(q, wq)
    assert_same_bits(params, wp)
    assert_same_bits(ds.dequantize(q, params, groups, bits, qtype),
                     cq.dequantize_groupwise(wq, wp, bits, sym, x.size // groups, np.float16))
    out32 = ds.dequantize_fp32(q, params, groups, bits, int(qtype))
    assert out32.dtype == np.float32 and out32.shape == x.shape


def test_deepspeed_refusals():
    x = np.ones((4, 10), np.float16)
    with pytest.raises(ValueError, match="groups must divide"):
        ds.quantize(x, 3, 8, ds.QuantizationType.Symmetric)
    with pytest.raises(TypeError, match="groups"):
        ds.quantize(x, 2.0, 8, ds.QuantizationType.Symmetric)
    with pytest.raises(ValueError, match="quant_type"):
        ds.quantize(x, 2, 8, 7)


# ---------------------------------------------------------------------------------------
# On a GPU, against the TileOPs reference expressions in torch

@pytest.mark.gpu
def test_tileops_torch_reference_expressions():
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(7)
    x = (torch.randn(512, 1024, device="cuda", generator=g) * 3).to(torch.bfloat16)
    xf = x.float()

    def sym_int8(xf, amax):
        s = torch.where(amax == 0, torch.ones_like(amax), amax / 127)
        return (xf / s).round().clamp(-127, 127).to(torch.int8), s

    q, s = to.INT8QuantPerTensorFwdOp()(x)
    rq, rs = sym_int8(xf, xf.abs().amax())
    assert_same_bits(q, rq)
    assert_same_bits(s, rs.reshape(1))
    q, s = to.INT8QuantPerChannelFwdOp()(x)
    rq, rs = sym_int8(xf, xf.abs().amax(dim=1, keepdim=True))
    assert_same_bits(q, rq)
    assert_same_bits(s, rs.reshape(-1))
    q, s = to.INT8QuantPerBlockFwdOp()(x)
    blocks = xf.view(512, 8, 128)
    rq, rs = sym_int8(blocks, blocks.abs().amax(dim=2, keepdim=True))
    assert_same_bits(q, rq.view(512, 1024))
    assert_same_bits(s, rs.view(512, 8))
    smooth = torch.rand(1024, device="cuda", generator=g) + 0.5
    q, s = to.SmoothQuantFwdOp()(x, smooth)
    xs = xf / smooth
    rq, rs = sym_int8(xs, xs.abs().amax(dim=1, keepdim=True))
    assert_same_bits(q, rq)
    assert_same_bits(s, rs.reshape(-1))
    # DeepSeek-V3 block weights: the expression issue and seed state
    w = (torch.randn(1024, 768, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    q, s = to.FP8QuantPerBlockFwdOp()(w)
    amax = w.float().view(8, 128, 6, 128).abs().amax(dim=(1, 3))
    rs = torch.where(amax == 0, torch.ones_like(amax), amax / 448)
    rq = (w.float().view(8, 128, 6, 128) / rs.view(8, 1, 6, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert q.dtype == torch.float8_e4m3fn
    assert_same_bits(q, rq.view(1024, 768))
    assert_same_bits(s, rs)
    for op_cls, ref in [
        (to.INT8DequantPerTensorFwdOp, lambda q, s, d: (q.float() * s).to(d)),
        (to.INT8DequantPerChannelFwdOp, lambda q, s, d: (q.float() * s[:, None]).to(d)),
        (to.INT8DequantPerBlockFwdOp,
         lambda q, s, d: (q.float() * s.repeat_interleave(128, dim=1)[:, :q.shape[1]]).to(d)),
    ]:
        quant = {to.INT8DequantPerTensorFwdOp: to.INT8QuantPerTensorFwdOp,
                 to.INT8DequantPerChannelFwdOp: to.INT8QuantPerChannelFwdOp,
                 to.INT8DequantPerBlockFwdOp: to.INT8QuantPerBlockFwdOp}[op_cls]()
        qq, ss = quant(x[:, :1000])
        for d in (torch.float16, torch.bfloat16, torch.float32):
            out = op_cls(d)(qq, ss)
            assert out.dtype == d and out.is_cuda
            assert_same_bits(out, ref(qq, ss, d))
