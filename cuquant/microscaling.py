"""Microscaling formats: MXFP8, MXFP4 and NVFP4 (docs/formats.md section 9).

Blocks run along the last axis of x [M, K] (K a multiple of the block):

- MXFP8: blocks of 32, e4m3 codes, one E8M0 scale (a power of two) a block;
- MXFP4: blocks of 32, e2m1 codes packed two a byte (element 2i in the low nibble), E8M0
  scales;
- NVFP4: blocks of 16, e2m1 codes packed as MXFP4, an e4m3 scale a block and one float32
  global amax (TransformerEngine's recipe).

E8M0 scales come back as ml_dtypes.float8_e8m0fnu (NumPy), torch.float8_e8m0fnu,
jnp.float8_e8m0fnu or uint8 (CuPy); e4m3 codes and scales as float8_e4m3fn codes do
elsewhere (uint8 on CuPy); packed e2m1 codes as uint8. ``scale_layout="swizzled"`` returns
the scales as the 1-D uint8 buffer that Blackwell's block-scaled GEMMs read: rows padded to
a multiple of 128, scale columns to a multiple of 4 (padding 0), scale (r, c) at
``((r // 128) * (C' / 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``.
Dequantizers take either layout.
"""

from __future__ import annotations

import numpy as np

from . import _numpy
from ._core import replay as _fast
from ._core.arrays import HOST
from ._core.call import host_results, intake, one_float32, out_dtype, same_place, stream_of, v
from ._core.declare import Out, declare, dtype_name, float_named
from ._core.dtypes import E4M3, E8M0
from ._cuda import microscaling as _gpu_mx
from ._cuda.launch import run as run_gpu
from ._cuda.policy import DEFAULT_POLICY, check_policy
from ._numpy.microscaling import MX_BLOCK, NV_BLOCK, swizzled_size

SCALE_MODES = ("rceil", "floor")
SCALE_LAYOUTS = ("row", "swizzled")
ROUNDINGS = ("nearest", "stochastic")

__all__ = ["quantize_mxfp8", "dequantize_mxfp8", "quantize_mxfp4", "dequantize_mxfp4",
           "quantize_nvfp4", "dequantize_nvfp4"]

_U8 = np.dtype(np.uint8)
_F32 = np.dtype(np.float32)
_E8M0_IN = {_U8: "uint8", E8M0.numpy: E8M0.name}
_E4M3_IN = {_U8: "uint8", E4M3.numpy: E4M3.name}


# ---------------------------------------------------------------------------------------
# Declared outputs (cuquant/_core/declare.py)

def _scales_out(a, m, k, block, name):
    if a["scale_layout"] == "swizzled":
        rows, cols = swizzled_size(m, k // block)
        return Out((rows * cols,), "uint8")
    return Out((m, k // block), name)


def _q_mxfp8(a):
    m, k = a["x"].shape
    return [Out((m, k), "float8_e4m3fn"), _scales_out(a, m, k, MX_BLOCK, "float8_e8m0fnu")]


def _q_mxfp4(a):
    m, k = a["x"].shape
    return [_codes_out(a, "quantize_mxfp4", m, k),
            _scales_out(a, m, k, MX_BLOCK, "float8_e8m0fnu")]


def _q_nvfp4(a):
    m, k = a["x"].shape
    return [_codes_out(a, "quantize_nvfp4", m, k),
            _scales_out(a, m, k, NV_BLOCK, "float8_e4m3fn"), Out((1,), "float32")]


def _codes_out(a, op, m, k):
    """Packed e2m1 codes: uint8, or torch's float4_e2m1fn_x2 (torch tensors only)."""
    if _fp4x2_named(a["codes_dtype"]):
        if not type(a["x"]).__module__.startswith("torch"):
            raise ValueError(_FP4X2_TORCH_ONLY.format(op=op))
        return Out((m, k // 2), "float4_e2m1fn_x2")
    return Out((m, k // 2), "uint8")


_FP4X2_TORCH_ONLY = ("{op}: codes_dtype='float4_e2m1fn_x2' is torch's packed float4 dtype, for "
                     "torch tensors; NumPy, CuPy and JAX hold packed e2m1 codes as uint8")


def _fp4x2_named(codes_dtype) -> bool:
    return dtype_name(codes_dtype) == "float4_e2m1fn_x2"


def _check_codes_dtype(codes_dtype, a, op) -> bool:
    """Whether the packed codes come back as torch.float4_e2m1fn_x2 (`codes_dtype`), else
    uint8; refused for other families and for a torch without that dtype."""
    if _fp4x2_named(codes_dtype):
        if a.family != "torch":
            raise ValueError(_FP4X2_TORCH_ONLY.format(op=op))
        import torch

        if not hasattr(torch, "float4_e2m1fn_x2"):
            raise ValueError(f"{op}: codes_dtype='float4_e2m1fn_x2' needs torch 2.8 or later; "
                             f"this is torch {torch.__version__}")
        return True
    if dtype_name(codes_dtype) != "uint8":
        raise ValueError(f"{op}: codes_dtype must be 'uint8' or 'float4_e2m1fn_x2'; got "
                         f"{codes_dtype!r}")
    return False


def _host_codes(res, fp4x2: bool):
    """Host results with the codes (first) as torch.float4_e2m1fn_x2 when asked."""
    if not fp4x2:
        return res
    import torch

    return (res[0].view(torch.float4_e2m1fn_x2),) + tuple(res[1:])


def _dq_mx8(a):
    return [Out(a["q"].shape, float_named(a["dtype"]))]


def _dq_fp4(a):
    m, half = a["q"].shape
    return [Out((m, 2 * half), float_named(a["dtype"]))]


# ---------------------------------------------------------------------------------------
# Checks shared by the ops

def _check_x(x, op, s, block):
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    v.check_ndim(a, op, "x", 2, "[M, K]")
    k = a.data.shape[1]
    if k % block:
        raise ValueError(f"{op}: x must have K (its last axis) a multiple of the block, {block}; "
                         f"got shape {tuple(a.data.shape)}")
    return a, t


def _check_rounding(op, a, rounding, rbits, seed, s):
    """(mode, rbits In or None, seed int) of a rounding argument set."""
    v.check_choice(rounding, op, "rounding", ROUNDINGS)
    if rounding == "nearest":
        if rbits is not None or seed is not None:
            raise ValueError(f"{op}: rbits and seed apply to rounding='stochastic' only; got "
                             f"rounding='nearest' with {'rbits' if rbits is not None else 'seed'}")
        return _gpu_mx.NEAREST, None, 0
    if (rbits is None) == (seed is None):
        raise ValueError(f"{op}: rounding='stochastic' needs exactly one of rbits (uint32 "
                         f"[M, K]) or seed (int); got "
                         f"{'both' if rbits is not None else 'neither'}")
    if seed is not None:
        return _gpu_mx.PHILOX, None, v.check_seed(seed, op)
    r = intake(rbits, op, "rbits", s)
    if r.data.dtype != np.uint32:
        raise TypeError(f"{op}: rbits must be uint32; got {v.dtype_name(r)}")
    v.check_shape(r, op, "rbits", a.data.shape, "[M, K], one word per element of x")
    same_place(op, ("x", a), ("rbits", r))
    return _gpu_mx.RBITS, r, 0


def _check_scales(op, sc, m, c, allowed):
    """Scales of [M, C] blocks in either layout: [M, C] (row) or the 1-D swizzled buffer of
    R' * C' bytes. Returns True for the swizzled layout."""
    v.check_dtype(sc, op, "scales", allowed)
    shape = tuple(sc.data.shape)
    rp, cp = swizzled_size(m, c)
    if shape == (m, c):
        return False
    if shape == (rp * cp,):
        return True
    raise ValueError(f"{op}: scales must have shape {(m, c)} (scale_layout 'row') or "
                     f"{(rp * cp,)} (scale_layout 'swizzled', rows padded to {rp}, columns to "
                     f"{cp}) for q of {m} rows and {c} blocks a row; got {shape}")


def _dequant_intake(op, q, scales, s, per_byte, block, scale_dtypes):
    """A dequantizer's codes, e4m3 [M, K] (per_byte 1) or packed e2m1 [M, K/2] (2), and its
    scales, checked against each other: (codes, scales, whether the scales are swizzled)."""
    a = intake(q, op, "q", s)
    v.check_ndim(a, op, "q", 2, "[M, K]" if per_byte == 1 else "[M, K/2]")
    if per_byte == 1:
        v.check_dtype(a, op, "q", _E4M3_IN)
    else:
        v.check_exact_dtype(a, op, "q", np.uint8)
    m, k = a.data.shape[0], a.data.shape[1] * per_byte
    if k % block:
        what = "K" if per_byte == 1 else "2 * its last axis (K)"
        raise ValueError(f"{op}: q must have {what} a multiple of the block, {block}; got "
                         f"shape {tuple(a.data.shape)}")
    sc = intake(scales, op, "scales", s)
    return a, sc, _check_scales(op, sc, m, k // block, scale_dtypes)


# What differs between the three dequantizers: codes a byte, block, scale dtypes, NumPy twin
# (NVFP4's takes the global amax before the output dtype).
_DEQUANT = {
    _gpu_mx.MXFP8: (1, MX_BLOCK, _E8M0_IN, _numpy.dequantize_mxfp8),
    _gpu_mx.MXFP4: (2, MX_BLOCK, _E8M0_IN, _numpy.dequantize_mxfp4),
    _gpu_mx.NVFP4: (2, NV_BLOCK, _E4M3_IN, _numpy.dequantize_nvfp4),
}


def _dequantize(op, fmt, q, scales, global_amax, dtype, stream, policy):
    """The dequantizers' one body; `global_amax` is NVFP4's (any float32 value, as the
    quantizer returned it: 0, NaN and infinity included) and None for the others."""
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    out = out_dtype(dtype, op)
    per_byte, block, scale_dtypes, twin = _DEQUANT[fmt]
    a, sc, swz = _dequant_intake(op, q, scales, s, per_byte, block, scale_dtypes)
    amax = None
    if fmt == _gpu_mx.NVFP4:
        amax = one_float32(global_amax, op, "global_amax", ("q", a), s, positive=False)
    same_place(op, ("q", a), ("scales", sc))
    if a.device == HOST:
        extra = () if amax is None else (amax[0],)
        return host_results(a, twin(a.data, sc.data, *extra, out))
    return run_gpu(a, s, _gpu_mx.dequantize, a.data, sc.data, amax, fmt, swz, out, policy)


# ---------------------------------------------------------------------------------------
# MXFP8

@declare(_q_mxfp8)
@_fast.replayable
def quantize_mxfp8(x, scale_mode="rceil", scale_layout="row", *, stream=None,
                   policy=DEFAULT_POLICY):
    """Quantize blocks of 32 elements along K to e4m3 codes with one E8M0 scale a block.

    Parameters
    ----------
    x : array [M, K], float16, bfloat16 or float32; K a multiple of 32
    scale_mode : {"rceil", "floor"}
        "rceil" (TransformerEngine, cuBLAS): ``amax * f32(1/448)`` rounded up to a power of
        two; "floor" (OCP MX v1.0, torchao): ``2**(floor(log2(amax)) - 8)``. A block with a
        NaN or infinity gets the NaN scale (0xFF), an all-zero block 2**-127 (0x00).
    scale_layout : {"row", "swizzled"}
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : float8_e4m3fn array [M, K] (uint8 codes on CuPy)
        ``e4m3(clamp(x * 2**(127 - b), -448, 448))``, NaN as 0x7F.
    scales : float8_e8m0fnu array [M, K/32] (uint8 on CuPy) for "row"; uint8 [R' * C'] for
        "swizzled"
    """
    op = "quantize_mxfp8"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    v.check_choice(scale_mode, op, "scale_mode", SCALE_MODES)
    v.check_choice(scale_layout, op, "scale_layout", SCALE_LAYOUTS)
    a, t = _check_x(x, op, s, MX_BLOCK)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_mxfp8(a.data, scale_mode, scale_layout))
    return run_gpu(a, s, _gpu_mx.quantize_mx, a.data, t, _gpu_mx.MXFP8, scale_mode,
                   scale_layout, _gpu_mx.NEAREST, None, 0, policy)


@declare(_dq_mx8)
@_fast.replayable
def dequantize_mxfp8(q, scales, dtype, *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize MXFP8: ``dtype(f32(e4m3_decode(q)) * 2**(b - 127))``.

    Parameters
    ----------
    q : float8_e4m3fn (or uint8 codes) array [M, K], K a multiple of 32
    scales : float8_e8m0fnu or uint8 array, [M, K/32] or swizzled [R' * C']
    dtype : float16, bfloat16 or float32
    stream : optional
    policy : KernelPolicy, optional

    Returns
    -------
    x : array of `dtype`, [M, K]
    """
    return _dequantize("dequantize_mxfp8", _gpu_mx.MXFP8, q, scales, None, dtype, stream,
                       policy)


# ---------------------------------------------------------------------------------------
# MXFP4

@declare(_q_mxfp4)
@_fast.replayable(values=v.SEED_VALUE)
def quantize_mxfp4(x, scale_mode="rceil", scale_layout="row", rounding="nearest", rbits=None,
                   seed=None, *, codes_dtype="uint8", stream=None, policy=DEFAULT_POLICY):
    """Quantize blocks of 32 elements along K to e2m1 codes with one E8M0 scale a block.

    Parameters
    ----------
    x : array [M, K], float16, bfloat16 or float32; K a multiple of 32
    scale_mode : {"rceil", "floor"}
        "rceil": ``amax * f32(1/6)`` rounded up to a power of two; "floor" (OCP):
        ``2**(floor(log2(amax)) - 2)``. NaN or infinity in a block gives 0xFF, zeros 0x00.
    scale_layout : {"row", "swizzled"}
    rounding : {"nearest", "stochastic"}
        e2m1 of ``v = x * 2**(127 - b)``: to nearest even on the grid {0, 0.5, 1, 1.5, 2,
        3, 4, 6}, saturating at 6, sign kept (-0 gives 0x8), NaN 0x0; or stochastic: for
        |v| between grid points lo <= |v| < hi, up iff
        ``f32(rbits >> 8) < (|v| - lo) / (hi - lo) * 2**24``.
    rbits : uint32 array [M, K], optional
        One random word per element, for ``rounding="stochastic"``.
    seed : int in [0, 2**64), optional
        For ``rounding="stochastic"`` instead of rbits: the Philox4x32-10 words of
        `cuquant.zero_point.random_bits(x.shape, seed)`, the same on CPU and GPU.
    codes_dtype : {"uint8", "float4_e2m1fn_x2"}
        "float4_e2m1fn_x2" (or torch.float4_e2m1fn_x2), for torch tensors: the packed codes
        as torch's float4 pair dtype (the same bytes).
    stream : optional
    policy : KernelPolicy, optional

    Returns
    -------
    q : uint8 array [M, K/2] (or torch.float4_e2m1fn_x2), element 2i in the low nibble
    scales : float8_e8m0fnu array [M, K/32] (uint8 on CuPy) for "row"; uint8 [R' * C'] for
        "swizzled"
    """
    op = "quantize_mxfp4"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    v.check_choice(scale_mode, op, "scale_mode", SCALE_MODES)
    v.check_choice(scale_layout, op, "scale_layout", SCALE_LAYOUTS)
    a, t = _check_x(x, op, s, MX_BLOCK)
    mode, r, sd = _check_rounding(op, a, rounding, rbits, seed, s)
    fp4x2 = _check_codes_dtype(codes_dtype, a, op)
    if a.device == HOST:
        return _host_codes(host_results(a, _numpy.quantize_mxfp4(
            a.data, scale_mode, scale_layout, rounding, None if r is None else r.data,
            sd if mode == _gpu_mx.PHILOX else None)), fp4x2)
    return run_gpu(a, s, _gpu_mx.quantize_mx, a.data, t, _gpu_mx.MXFP4, scale_mode,
                   scale_layout, mode, None if r is None else r.data, sd, policy, fp4x2)


@declare(_dq_fp4)
@_fast.replayable
def dequantize_mxfp4(q, scales, dtype, *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize MXFP4: ``dtype(f32(e2m1_decode(q)) * 2**(b - 127))``.

    Parameters
    ----------
    q : uint8 array [M, K/2] (or torch.float4_e2m1fn_x2), element 2i in the low nibble;
        K a multiple of 32
    scales : float8_e8m0fnu or uint8 array, [M, K/32] or swizzled [R' * C']
    dtype : float16, bfloat16 or float32
    stream : optional
    policy : KernelPolicy, optional

    Returns
    -------
    x : array of `dtype`, [M, K]
    """
    return _dequantize("dequantize_mxfp4", _gpu_mx.MXFP4, q, scales, None, dtype, stream,
                       policy)


# ---------------------------------------------------------------------------------------
# NVFP4

@declare(_q_nvfp4)
@_fast.replayable(values=v.SEED_VALUE)
def quantize_nvfp4(x, global_amax=None, scale_layout="row", rounding="nearest", rbits=None,
                   seed=None, *, codes_dtype="uint8", stream=None, policy=DEFAULT_POLICY):
    """Quantize blocks of 16 elements along K to e2m1 codes with an e4m3 scale a block and
    one float32 global amax (NVFP4, TransformerEngine's recipe).

    With ``A = max |x|`` over the tensor (or `global_amax`), ``S_enc = 1 if A == 0 else
    min(f32(2688 / A), FLT_MAX)`` and ``S_dec = f32(1 / S_enc)``; per block
    ``s = e4m3(min(amax_b * f32(S_enc * f32(1/6)), 448))`` (NaN as 0x7F, no lower clamp),
    ``r = min(f32(1 / f32(f32(s) * S_dec)), FLT_MAX)`` and ``q = e2m1(x * r)``.

    Parameters
    ----------
    x : array [M, K], float16, bfloat16 or float32; K a multiple of 16
    global_amax : positive finite float, or float32 array of one element, optional
        A calibrated A (no pass over the tensor for it). A device array is read by the
        kernel as it is.
    scale_layout : {"row", "swizzled"}
    rounding : {"nearest", "stochastic"}, rbits, seed, codes_dtype
        As `quantize_mxfp4`.
    stream : optional
    policy : KernelPolicy, optional

    Returns
    -------
    q : uint8 array [M, K/2] (or torch.float4_e2m1fn_x2), element 2i in the low nibble
    scales : float8_e4m3fn array [M, K/16] (uint8 on CuPy) for "row"; uint8 [R' * C'] for
        "swizzled"
    global_amax : float32 array [1]
        A (the caller's array itself, reshaped, when one was given on the device).
    """
    op = "quantize_nvfp4"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    v.check_choice(scale_layout, op, "scale_layout", SCALE_LAYOUTS)
    a, t = _check_x(x, op, s, NV_BLOCK)
    value = device_amax = None
    if global_amax is not None:  # a device array is read by the kernel as it is
        value, device_amax = one_float32(global_amax, op, "global_amax", ("x", a), s)
    mode, r, sd = _check_rounding(op, a, rounding, rbits, seed, s)
    fp4x2 = _check_codes_dtype(codes_dtype, a, op)
    if a.device == HOST:
        return _host_codes(host_results(a, _numpy.quantize_nvfp4(
            a.data, value, scale_layout, rounding, None if r is None else r.data,
            sd if mode == _gpu_mx.PHILOX else None)), fp4x2)
    return run_gpu(a, s, _gpu_mx.quantize_nv, a.data, t, scale_layout, mode,
                   None if r is None else r.data, sd, value, device_amax, policy, fp4x2)


@declare(_dq_fp4)
@_fast.replayable
def dequantize_nvfp4(q, scales, global_amax, dtype, *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize NVFP4: ``dtype(f32(e2m1_decode(q)) * f32(f32(s) * S_dec))``, S_dec
    recomputed from the global amax as the quantizer does.

    Parameters
    ----------
    q : uint8 array [M, K/2] (or torch.float4_e2m1fn_x2), element 2i in the low nibble;
        K a multiple of 16
    scales : float8_e4m3fn or uint8 array, [M, K/16] or swizzled [R' * C']
    global_amax : float32 array of one element (or a number)
        What the quantizer returned (0, NaN and infinity included).
    dtype : float16, bfloat16 or float32
    stream : optional
    policy : KernelPolicy, optional

    Returns
    -------
    x : array of `dtype`, [M, K]
    """
    return _dequantize("dequantize_nvfp4", _gpu_mx.NVFP4, q, scales, global_amax, dtype,
                       stream, policy)
