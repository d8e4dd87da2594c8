"""The one table of dtypes: what cuquant reads and writes, their NumPy types, C++ names
and code bounds. Every other module looks dtypes up here."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class FloatType:
    """A floating-point input or output type."""

    name: str
    numpy: np.dtype
    cxx: str  # the kernels' storage type
    nan_bits: int  # the canonical NaN the GPU produces, as unsigned bits

    @property
    def vector_width(self) -> int:
        """Elements in one 16-byte access, the kernels' vector."""
        return 16 // self.numpy.itemsize


@dataclass(frozen=True)
class CodeType:
    """A quantized code format."""

    name: str
    numpy: np.dtype  # how NumPy holds the codes
    cxx: str  # the kernels' code trait
    qmin: int | float
    qmax: int | float

    @functools.cached_property
    def inv_qmax(self) -> np.float32:
        """f32(1/qmax), the constant scales are multiplied by (docs/formats.md section 1,
        C(1/n))."""
        return np.float32(1.0) / np.float32(self.qmax)

    @functools.cached_property
    def inv_qmax_bits(self) -> int:
        """inv_qmax as the bits a kernel argument block takes."""
        return int(self.inv_qmax.view(np.uint32))


FLOAT16 = FloatType("float16", np.dtype(np.float16), "cq::half", 0x7FFF)
BFLOAT16 = FloatType("bfloat16", np.dtype(ml_dtypes.bfloat16), "cq::bfloat16", 0x7FFF)
FLOAT32 = FloatType("float32", np.dtype(np.float32), "float", 0x7FFFFFFF)

FLOATS = {t.name: t for t in (FLOAT16, BFLOAT16, FLOAT32)}
HALVES = {t.name: t for t in (FLOAT16, BFLOAT16)}

INT8 = CodeType("int8", np.dtype(np.int8), "cq::CodeInt8", -127, 127)
E4M3 = CodeType("float8_e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), "cq::CodeE4M3", -448.0, 448.0)
INT4 = CodeType("int4", np.dtype(np.int8), "", -8, 7)  # two's complement nibbles, packed
UINT4 = CodeType("uint4", np.dtype(np.uint8), "", 0, 15)  # zero-point codes, packed
UINT8 = CodeType("uint8", np.dtype(np.uint8), "", 0, 255)
# Microscaling (docs/formats.md section 9): e2m1 codes packed two a byte (element 2i in the
# low nibble), and E8M0 scales, a byte b meaning 2**(b - 127) (0xFF NaN).
E2M1 = CodeType("float4_e2m1fn", np.dtype(np.uint8), "", -6.0, 6.0)
E8M0 = CodeType("float8_e8m0fnu", np.dtype(ml_dtypes.float8_e8m0fnu), "", 2.0 ** -127, 2.0 ** 127)

CODES = {t.name: t for t in (INT8, E4M3, INT4, UINT4, UINT8, E2M1, E8M0)}

# One-byte codes that frameworks hold in a dtype of their own but CuPy (no such dtypes) and
# DLPack carry as uint8: the NumPy dtype of each, by its name in torch and JAX, which name
# them alike. Arrays of these cross as uint8 and are viewed back on the far side.
BYTE_CODES = {E4M3.name: E4M3.numpy, E8M0.name: E8M0.numpy}

# NumPy dtypes by name, for everything an array may arrive as.
_BY_NUMPY = {t.numpy: t for t in FLOATS.values()}


def float_type_of(np_dtype: np.dtype) -> FloatType | None:
    """The FloatType of a NumPy dtype, or None when it is not one cuquant reads."""
    return _BY_NUMPY.get(np_dtype)


_NAMED: dict = {}


def float_type_named(dtype, op: str, arg: str = "dtype") -> FloatType:
    """Resolve a user's dtype argument (NumPy, ml_dtypes, torch, JAX dtype or a name)."""
    try:
        return _NAMED[dtype]
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    t = _resolve(dtype, op, arg)
    try:
        if len(_NAMED) < 64:
            _NAMED[dtype] = t
    except TypeError:
        pass
    return t


def _resolve(dtype, op: str, arg: str) -> FloatType:
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:  # torch.float16 and the like
            name = str(dtype).removeprefix("torch.")
    name = {"half": "float16", "float": "float32", "bf16": "bfloat16"}.get(name, name)
    try:
        return FLOATS[name]
    except KeyError:
        raise TypeError(
            f"{op}: {arg} must be one of float16, bfloat16, float32; got {dtype!r}"
        ) from None
