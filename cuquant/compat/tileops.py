"""TileOPs-style quantization ops: construct once (with the seed's keyword arguments),
then call. Shapes, dtypes and return order follow TileOPs' documentation; each op is a
thin layer over the cuquant function named in its docstring, so it takes any array
family and returns that family.

    op = INT8QuantPerChannelFwdOp()
    q, scale = op(w)
"""

from __future__ import annotations

import cuquant as _cq

#: The in-tree kernels; the only target there is.
BUILTIN = "builtin"

__all__ = ["BUILTIN", "INT8QuantPerTensorFwdOp", "INT8QuantPerChannelFwdOp",
           "INT8QuantPerBlockFwdOp", "SmoothQuantFwdOp", "FP8QuantFwdOp",
           "FP8QuantPerBlockFwdOp", "INT4QuantPerGroupFwdOp", "INT8DequantPerTensorFwdOp",
           "INT8DequantPerChannelFwdOp", "INT8DequantPerBlockFwdOp"]


class _Op:
    """Built once, then called; `target` None (the input's device decides) or BUILTIN."""

    def __init__(self, *, target=None):
        if target not in (None, BUILTIN):
            raise ValueError(f"{type(self).__name__}: target must be None or {BUILTIN!r}; "
                             f"got {target!r}")
        self.target = target

    def __call__(self, *args):
        return self.forward(*args)

    def forward(self, *args):  # pragma: no cover - every op overrides it
        raise NotImplementedError


class INT8QuantPerTensorFwdOp(_Op):
    """x [M, K] -> (q int8 [M, K], scale f32 [1]); `cuquant.quantize_int8_per_tensor`."""

    def forward(self, x):
        return _cq.quantize_int8_per_tensor(x)


class INT8QuantPerChannelFwdOp(_Op):
    """w [N, K] -> (q int8 [N, K], scale f32 [N]); `cuquant.quantize_int8_per_channel`."""

    def forward(self, w):
        return _cq.quantize_int8_per_channel(w)


class INT8QuantPerBlockFwdOp(_Op):
    """x [M, K] -> (q int8, scale [M, ceil(K/128)]); `cuquant.quantize_int8_per_block`."""

    def forward(self, x):
        return _cq.quantize_int8_per_block(x, 128)


class SmoothQuantFwdOp(_Op):
    """(x [M, K], smooth f32 [K]) -> (q int8, scale [M]); `cuquant.smooth_quant`."""

    def forward(self, x, smooth):
        return _cq.smooth_quant(x, smooth)


class FP8QuantFwdOp(_Op):
    """input [B, S, G, D] -> (scale [B, S, G], output float8_e4m3fn): the scale FIRST, as
    TileOPs returns it; `cuquant.quantize_fp8_per_row`."""

    def forward(self, input_tensor):
        q, scale = _cq.quantize_fp8_per_row(input_tensor)
        return scale, q


class FP8QuantPerBlockFwdOp(_Op):
    """w [N, K] -> (q float8_e4m3fn, scale [ceil(N/128), ceil(K/128)]);
    `cuquant.quantize_fp8_per_block`."""

    def forward(self, w):
        return _cq.quantize_fp8_per_block(w)


class INT4QuantPerGroupFwdOp(_Op):
    """w [N, K] -> (packed int8 [N, K/2], params f32 [N*K/group_size, 2]);
    `cuquant.quantize_int4_per_group`."""

    def __init__(self, group_size=128, *, target=None):
        super().__init__(target=target)
        self.group_size = group_size

    def forward(self, w):
        return _cq.quantize_int4_per_group(w, self.group_size)


class _Dequant(_Op):
    def __init__(self, out_dtype, *, target=None):
        super().__init__(target=target)
        self.out_dtype = out_dtype


class INT8DequantPerTensorFwdOp(_Dequant):
    """(q int8 [M, K], scale f32 [1]) -> x of out_dtype; `cuquant.dequantize_int8_per_tensor`."""

    def forward(self, q, scale):
        return _cq.dequantize_int8_per_tensor(q, scale, self.out_dtype)


class INT8DequantPerChannelFwdOp(_Dequant):
    """(q int8 [M, K], scale f32 [M]) -> x; `cuquant.dequantize_int8_per_channel`."""

    def forward(self, q, scale):
        return _cq.dequantize_int8_per_channel(q, scale, self.out_dtype)


class INT8DequantPerBlockFwdOp(_Dequant):
    """(q int8 [M, K], scale f32 [M, ceil(K/128)]) -> x; `cuquant.dequantize_int8_per_block`."""

    def forward(self, q, scale):
        return _cq.dequantize_int8_per_block(q, scale, self.out_dtype, 128)
