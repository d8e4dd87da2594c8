"""FP8 (float8_e4m3fn) quantization and dequantization (docs/formats.md section 4).

q = e4m3(clamp(f32(x) / scale, -448, 448)), rounded to nearest even, NaN as code 0x7F;
dequantization is dtype(f32(e4m3_decode(q)) * scale). Codes come back as
ml_dtypes.float8_e4m3fn (NumPy), torch.float8_e4m3fn, jnp.float8_e4m3fn, or uint8 (CuPy).
"""

from __future__ import annotations

import numpy as np

from . import _numpy
from ._core.arrays import HOST
from ._core.call import (check_one_value, dequant_args, host_results, intake, scale_argument,
                         scale_type_of, stream_of, v)
from ._core.dtypes import E4M3
from ._core.replay import replayable
from ._core.declare import Out, cdiv, declare, dtype_name, float_named
from ._cuda import symmetric as _symmetric
from ._cuda.launch import run as run_gpu
from ._cuda.policy import DEFAULT_POLICY, check_policy

GROUP_SIZES = (32, 64, 128, 256)
SCALE_LAYOUTS = ("row", "column")
SCALE_FORMATS = ("float32", "ue8m0")
BLOCK_SIZE = (128, 128)
ROW_EPS = np.float32(1e-4)

__all__ = ["quantize_fp8_per_tensor", "quantize_fp8_per_row", "quantize_fp8_per_token_group",
           "quantize_fp8_per_block", "dequantize_fp8_per_tensor", "dequantize_fp8_per_row",
           "dequantize_fp8_per_token_group", "dequantize_fp8_per_block", "GROUP_SIZES"]


# ---------------------------------------------------------------------------------------
# Quantization

def _q_tensor(a):
    return [Out(a["x"].shape, "float8_e4m3fn"), Out((1,), "float32")]

@declare(_q_tensor)
@replayable
def quantize_fp8_per_tensor(x, scale=None, *, stream=None, policy=DEFAULT_POLICY):
    """Quantize a whole tensor to float8_e4m3fn against one scale.

    Parameters
    ----------
    x : array, any shape, float16, bfloat16 or float32
    scale : None, float, or float32 array of one element, optional
        A static scale. None computes ``amax(|x|) * f32(1/448)``, or 1.0 for all zeros.
    stream : CuPy stream, torch.cuda.Stream or int, optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : float8_e4m3fn array (uint8 codes for CuPy), shape of x
    scale : float32 array (1,)
    """
    op = "quantize_fp8_per_tensor"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    value = device_scale = None
    if scale is not None:
        value, device_scale = scale_argument(scale, op, a, s)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_fp8_per_tensor(a.data, value))
    return run_gpu(a, s, _symmetric.run_tensor, a.data, t, E4M3, value, device_scale)


def _q_row(a):
    x = a["x"]
    return [Out(x.shape, "float8_e4m3fn"), Out(x.shape[:-1], float_named(a["scale_dtype"]))]

@declare(_q_row)
@replayable
def quantize_fp8_per_row(x, *, scale_dtype="float32", stream=None, policy=DEFAULT_POLICY):
    """Quantize each row (last axis) to float8_e4m3fn: the seed's FP8QuantFwdOp on
    ``[B, S, G, D]``, any rank >= 1.

    Parameters
    ----------
    x : array [..., D], float16, bfloat16 or float32
    scale_dtype : "float32" (default) or x's own dtype
        The stored type of the scales. In x's 16-bit dtype each scale is rounded to it,
        nearest even, and the codes are computed against the rounded scale.
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : float8_e4m3fn array, shape of x
    scale : array of `scale_dtype`, shape ``x.shape[:-1]``
        ``max(amax(|row|), f32(1e-4)) * f32(1/448)``.
    """
    op = "quantize_fp8_per_row"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    v.check_min_ndim(a, op, "x", 1, "[..., D]")
    st = scale_type_of(scale_dtype, t, op)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_fp8_per_row(a.data, st))
    return run_gpu(a, s, _symmetric.run_rows, a.data, t, E4M3, _symmetric.FLOOR_EPS, ROW_EPS,
                   None, st)



def _q_group(a):
    m, k = a["x"].shape
    return [Out((m, k), "float8_e4m3fn"),
            Out((m, cdiv(k, a["group_size"])), "float32", a["scale_layout"] == "column")]

@declare(_q_group)
@replayable
def quantize_fp8_per_token_group(x, group_size=128, eps=1e-4, scale_layout="row",
                                 scale_format="float32", *, stream=None, policy=DEFAULT_POLICY):
    """Quantize runs of `group_size` elements of each row to float8_e4m3fn (DeepSeek-V3
    activations, lmdeploy QuantizeSymm, vLLM per_token_group_quant_fp8).

    Parameters
    ----------
    x : array [M, K], float16, bfloat16 or float32
    group_size : {32, 64, 128, 256}, default 128
        Elements per group; the last group of a row holds K % group_size.
    eps : float > 0, default 1e-4
        Floor of a group's amax: ``scale = max(amax, f32(eps)) * f32(1/448)``.
    scale_layout : {"row", "column"}
        "row": scale is [M, ceil(K/G)] row-major. "column": the same logical shape, stored
        column-major with the M stride rounded up to 4 (a view of a
        [ceil(K/G), round_up(M, 4)] buffer whose padding is zero), as DeepGEMM reads it.
    scale_format : {"float32", "ue8m0"}
        "ue8m0" rounds each scale up to a power of two (still returned as float32).
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : float8_e4m3fn array [M, K]
    scale : float32 array [M, ceil(K / group_size)] in the chosen layout
    """
    op = "quantize_fp8_per_token_group"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    g = v.check_choice(v.check_int(group_size, op, "group_size"), op, "group_size", GROUP_SIZES)
    e = v.check_positive_finite(eps, op, "eps")
    v.check_choice(scale_layout, op, "scale_layout", SCALE_LAYOUTS)
    v.check_choice(scale_format, op, "scale_format", SCALE_FORMATS)
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    v.check_ndim(a, op, "x", 2, "[M, K]")
    if a.device == HOST:
        return host_results(a, _numpy.quantize_fp8_per_token_group(a.data, g, e, scale_layout,
                                                                   scale_format))
    rule = _symmetric.FLOOR_EPS_POW2 if scale_format == "ue8m0" else _symmetric.FLOOR_EPS
    return run_gpu(a, s, _symmetric.run_groups, a.data, t, E4M3, rule, g, e, scale_layout)



def _q_block(a):
    n, k = a["w"].shape
    return [Out((n, k), "float8_e4m3fn"), Out((cdiv(n, 128), cdiv(k, 128)), "float32")]

@declare(_q_block)
@replayable
def quantize_fp8_per_block(w, block_size=BLOCK_SIZE, scale_format="float32", *, stream=None,
                           policy=DEFAULT_POLICY):
    """Quantize each 128x128 tile of a weight to float8_e4m3fn: the DeepSeek-V3 block
    format, whose scale is stored as ``weight_scale_inv``.

    Parameters
    ----------
    w : array [N, K], float16, bfloat16 or float32
    block_size : (128, 128)
        Tile shape; edge tiles cover the N % 128 rows and K % 128 columns that remain.
    scale_format : {"float32", "ue8m0"}
        "ue8m0" rounds each scale up to a power of two (still returned as float32), as
        DeepSeek-V3's UE8M0 checkpoints store them; the codes are computed against the
        rounded scale.
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : float8_e4m3fn array [N, K]
    scale : float32 array [ceil(N / 128), ceil(K / 128)]
        ``amax(|tile|) * f32(1/448)``, or 1.0 for an all-zero tile; with
        ``scale_format="ue8m0"``, the smallest power of two at or above it.
    """
    op = "quantize_fp8_per_block"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    _check_block_size(block_size, op)
    v.check_choice(scale_format, op, "scale_format", SCALE_FORMATS)
    a = intake(w, op, "w", s)
    t = v.check_float(a, op, "w")
    v.check_ndim(a, op, "w", 2, "[N, K]")
    if a.device == HOST:
        return host_results(a, _numpy.quantize_fp8_per_block(a.data, BLOCK_SIZE, scale_format))
    rule = _symmetric.ZERO_IS_ONE_POW2 if scale_format == "ue8m0" else _symmetric.ZERO_IS_ONE
    return run_gpu(a, s, _symmetric.run_tiles, a.data, t, E4M3, rule)


def _check_block_size(block_size, op):
    if type(block_size) is tuple and block_size == BLOCK_SIZE:  # the default, at no cost
        return
    try:
        bs = tuple(int(b) for b in block_size)
    except TypeError:
        raise TypeError(f"{op}: block_size must be a pair of ints (128, 128); got "
                        f"{block_size!r}") from None
    if bs != BLOCK_SIZE:
        raise ValueError(f"{op}: block_size must be (128, 128); got {block_size!r}")



# ---------------------------------------------------------------------------------------
# Dequantization

def _dq(a):
    return [Out(a["q"].shape, float_named(a["dtype"]))]

@declare(_dq)
@replayable
def dequantize_fp8_per_tensor(q, scale, dtype, *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize float8_e4m3fn codes with one scale: ``dtype(f32(q) * scale)``.

    Parameters
    ----------
    q : float8_e4m3fn (or uint8 codes) array, any shape
    scale : float32 array of one element
    dtype : float16, bfloat16 or float32
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`, shape of q
    """
    op = "dequantize_fp8_per_tensor"
    policy = check_policy(policy, op)
    s, out, a, b = dequant_args(op, q, scale, dtype, stream, E4M3)
    check_one_value(b, op)
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_fp8_per_tensor(a.data, b.data, out))
    return run_gpu(a, s, _symmetric.run_dequantize, a.data, b.data, E4M3, out, "tensor")




@declare(_dq)
@replayable
def dequantize_fp8_per_row(q, scale, dtype, *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize float8_e4m3fn codes with one scale per row (last axis).

    Parameters
    ----------
    q : float8_e4m3fn (or uint8 codes) array [..., D]
    scale : float32 array, shape ``q.shape[:-1]``
    dtype : float16, bfloat16 or float32
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`, shape of q
    """
    op = "dequantize_fp8_per_row"
    policy = check_policy(policy, op)
    s, out, a, b = dequant_args(op, q, scale, dtype, stream, E4M3)
    v.check_min_ndim(a, op, "q", 1, "[..., D]")
    v.check_shape(b, op, "scale", a.data.shape[:-1], "q.shape[:-1]")
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_fp8_per_row(a.data, b.data, out))
    return run_gpu(a, s, _symmetric.run_dequantize, a.data, b.data, E4M3, out, "row")




@declare(_dq)
@replayable
def dequantize_fp8_per_token_group(q, scale, dtype, group_size=128,
                                   *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize float8_e4m3fn codes with one scale per `group_size` elements of a row.
    Either scale layout of `quantize_fp8_per_token_group` is accepted (any strides).

    Parameters
    ----------
    q : float8_e4m3fn (or uint8 codes) array [M, K]
    scale : float32 array [M, ceil(K / group_size)]
    dtype : float16, bfloat16 or float32
    group_size : {32, 64, 128, 256}, default 128
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`, [M, K]
    """
    op = "dequantize_fp8_per_token_group"
    policy = check_policy(policy, op)
    g = v.check_choice(v.check_int(group_size, op, "group_size"), op, "group_size", GROUP_SIZES)
    s, out, a, b = dequant_args(op, q, scale, dtype, stream, E4M3)
    v.check_ndim(a, op, "q", 2, "[M, K]")
    m, k = a.data.shape
    v.check_shape(b, op, "scale", (m, -(-k // g)), f"[M, ceil(K / {g})]")
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_fp8_per_token_group(a.data, b.data, out, g))
    return run_gpu(a, s, _symmetric.run_dequantize, a.data, b.data, E4M3, out, "group", g)




@declare(_dq)
@replayable
def dequantize_fp8_per_block(q, scale, dtype, block_size=BLOCK_SIZE,
                             *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize float8_e4m3fn codes with one scale per 128x128 tile.

    Parameters
    ----------
    q : float8_e4m3fn (or uint8 codes) array [N, K]
    scale : float32 array [ceil(N / 128), ceil(K / 128)] (``weight_scale_inv``)
    dtype : float16, bfloat16 or float32
    block_size : (128, 128)
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`, [N, K]
    """
    op = "dequantize_fp8_per_block"
    policy = check_policy(policy, op)
    _check_block_size(block_size, op)
    s, out, a, b = dequant_args(op, q, scale, dtype, stream, E4M3)
    v.check_ndim(a, op, "q", 2, "[N, K]")
    n, k = a.data.shape
    v.check_shape(b, op, "scale", (-(-n // 128), -(-k // 128)), "[ceil(N / 128), ceil(K / 128)]")
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_fp8_per_block(a.data, b.data, out, BLOCK_SIZE))
    return run_gpu(a, s, _symmetric.run_dequantize, a.data, b.data, E4M3, out, "tile")
