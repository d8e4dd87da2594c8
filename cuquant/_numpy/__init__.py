"""The NumPy backend: one twin per public op, same name and signature, same bits as the
GPU kernels. Host arrays run these; they are also the executable form of the contract."""

from .fp8 import (dequantize_fp8_per_block, dequantize_fp8_per_row, dequantize_fp8_per_tensor,
                  dequantize_fp8_per_token_group, quantize_fp8_per_block, quantize_fp8_per_row,
                  quantize_fp8_per_tensor, quantize_fp8_per_token_group)
from .int8 import (dequantize_int8_per_block, dequantize_int8_per_channel,
                   dequantize_int8_per_tensor, quantize_int8_per_block, quantize_int8_per_channel,
                   quantize_int8_per_tensor, smooth_quant)
from .groupwise import (dequantize_groupwise, dequantize_groupwise_batched,
                        dequantize_int4_per_group, quantize_groupwise, quantize_int4_per_group)
from .zero_point import dequantize_groupwise_zero_point, quantize_groupwise_zero_point
from .microscaling import (dequantize_mxfp4, dequantize_mxfp8, dequantize_nvfp4, quantize_mxfp4,
                           quantize_mxfp8, quantize_nvfp4)

__all__ = [
    "quantize_int8_per_tensor", "quantize_int8_per_channel", "quantize_int8_per_block",
    "smooth_quant", "dequantize_int8_per_tensor", "dequantize_int8_per_channel",
    "dequantize_int8_per_block",
    "quantize_fp8_per_tensor", "quantize_fp8_per_row", "quantize_fp8_per_token_group",
    "quantize_fp8_per_block", "dequantize_fp8_per_tensor", "dequantize_fp8_per_row",
    "dequantize_fp8_per_token_group", "dequantize_fp8_per_block",
    "quantize_groupwise", "dequantize_groupwise", "dequantize_groupwise_batched",
    "quantize_int4_per_group", "dequantize_int4_per_group",
    "quantize_groupwise_zero_point", "dequantize_groupwise_zero_point",
    "quantize_mxfp8", "dequantize_mxfp8", "quantize_mxfp4", "dequantize_mxfp4",
    "quantize_nvfp4", "dequantize_nvfp4",
]
