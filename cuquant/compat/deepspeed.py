"""DeepSpeed-style quantizer calls: groups given as a count, as DeepSpeed's binding takes
them, over cuquant's `quantize_groupwise` / `dequantize_groupwise` (which take a group
size, and neither pad groups nor read bfloat16 as float16).

    from cuquant.compat.deepspeed import quantize, dequantize, QuantizationType
    q, params = quantize(x, groups, 8, QuantizationType.Symmetric)
    x16 = dequantize(q, params, groups, 8, QuantizationType.Symmetric)
"""

from __future__ import annotations

import enum
import math

import cuquant as _cq

__all__ = ["QuantizationType", "quantize", "dequantize", "dequantize_fp32"]


class QuantizationType(enum.IntEnum):
    Symmetric = 0
    Asymmetric = 1


def _symmetric(qtype, op: str) -> bool:
    try:
        return QuantizationType(qtype) is QuantizationType.Symmetric
    except ValueError:
        raise ValueError(f"{op}: quant_type must be QuantizationType.Symmetric or "
                         f"Asymmetric; got {qtype!r}") from None


def _group_size(elements: int, groups, op: str) -> int:
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise TypeError(f"{op}: groups must be a positive int; got {groups!r}")
    if elements % groups:
        raise ValueError(f"{op}: groups must divide the element count ({elements}); got {groups}")
    return elements // groups


def _size(a) -> int:
    size = getattr(a, "size", None)
    size = size() if callable(size) else size  # torch's size() is a method
    return math.prod(size) if isinstance(size, tuple) else int(size)


def quantize(input_vals, groups, num_bits, quant_type):
    """[q, params]: `groups` equal groups of the flattened input, 4 or 8 bits."""
    op = "quantize"
    g = _group_size(_size(input_vals), groups, op)
    q, params = _cq.quantize_groupwise(input_vals, num_bits, _symmetric(quant_type, op), g)
    return [q, params]


def _dequantize(q, params, groups, num_bits, quant_type, dtype, op):
    elements = _size(q) * (2 if num_bits == 4 else 1)
    g = _group_size(elements, groups, op)
    return _cq.dequantize_groupwise(q, params, num_bits, _symmetric(quant_type, op), g, dtype)


def dequantize(quantized_data, params, groups, num_bits, quant_type):
    """float16 reconstruction of `quantize`'s output."""
    return _dequantize(quantized_data, params, groups, num_bits, quant_type, "float16",
                       "dequantize")


def dequantize_fp32(quantized_data, params, groups, num_bits, quant_type):
    """float32 reconstruction of `quantize`'s output."""
    return _dequantize(quantized_data, params, groups, num_bits, quant_type, "float32",
                       "dequantize_fp32")
