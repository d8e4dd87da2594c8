"""INT8 symmetric quantization and dequantization (docs/formats.md section 3).

scale = amax * f32(1/127), or 1 where amax == 0; q = clamp(rne(x / scale), -127, 127),
a NaN quotient giving 0; dequantization is dtype(f32(q) * scale).
"""

from __future__ import annotations


from . import _numpy
from ._core.arrays import HOST
from ._core.call import (check_one_value, dequant_args, host_results, intake, same_place,
                         scale_argument, scale_type_of, stream_of, v)
from ._core.dtypes import FLOATS, INT8
from ._core.replay import replayable
from ._core.declare import Out, cdiv, declare, dtype_name, float_named
from ._cuda import symmetric as _symmetric
from ._cuda.launch import run as run_gpu
from ._cuda.policy import DEFAULT_POLICY, check_policy

BLOCK_SIZES = (32, 64, 128, 256)

__all__ = ["quantize_int8_per_tensor", "quantize_int8_per_channel", "quantize_int8_per_block",
           "smooth_quant", "dequantize_int8_per_tensor", "dequantize_int8_per_channel",
           "dequantize_int8_per_block", "BLOCK_SIZES"]


def _block_size(block_size, op):
    bs = v.check_int(block_size, op, "block_size")
    v.check_choice(bs, op, "block_size", BLOCK_SIZES)
    return bs


# ---------------------------------------------------------------------------------------
# Quantization

def _q_tensor(a):
    return [Out(a["x"].shape, "int8"), Out((1,), "float32")]

@declare(_q_tensor)
@replayable
def quantize_int8_per_tensor(x, scale=None, *, stream=None, policy=DEFAULT_POLICY):
    """Quantize a whole tensor to int8 against one scale.

    Parameters
    ----------
    x : array, any shape, float16, bfloat16 or float32
        NumPy, CuPy, PyTorch, JAX or any DLPack array.
    scale : None, float, or float32 array of one element, optional
        A static scale (no amax pass). None (default) computes
        ``scale = amax(|x|) * f32(1/127)``, or 1.0 when x is all zero.
    stream : CuPy stream, torch.cuda.Stream or int, optional
        Stream of a GPU call; the current CuPy stream by default.
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : int8 array, shape of x
        ``clamp(rne(x / scale), -127, 127)``; a NaN quotient gives 0.
    scale : float32 array, shape (1,)
        The dequantization multiplier: ``x ~= q * scale``.
    """
    op = "quantize_int8_per_tensor"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    value = device_scale = None
    if scale is not None:
        value, device_scale = scale_argument(scale, op, a, s)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_int8_per_tensor(a.data, value))
    return run_gpu(a, s, _symmetric.run_tensor, a.data, t, INT8, value, device_scale)


def _q_channel(a):
    w = a["w"]
    st = float_named(a["scale_dtype"])
    return [Out(w.shape, "int8"), Out(w.shape[:-1], st)]

@declare(_q_channel)
@replayable
def quantize_int8_per_channel(w, *, scale_dtype="float32", stream=None, policy=DEFAULT_POLICY):
    """Quantize each row (output channel) of a weight to int8 against its own scale.

    Parameters
    ----------
    w : array [N, K], float16, bfloat16 or float32
    scale_dtype : "float32" (default) or w's own dtype
        The stored type of the scales. In w's 16-bit dtype (as checkpoints in a model's
        dtype keep them) each scale is rounded to it, nearest even, and the codes are
        computed against the rounded scale: ``q = clamp(rne(w / f32(scale)), -127, 127)``.
    stream : optional, as in `quantize_int8_per_tensor`
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : int8 array [N, K]
    scale : array [N] of `scale_dtype`
        ``amax(|w[n]|) * f32(1/127)``, or 1.0 for an all-zero (or empty) row.
    """
    op = "quantize_int8_per_channel"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    a = intake(w, op, "w", s)
    t = v.check_float(a, op, "w")
    v.check_ndim(a, op, "w", 2, "[N, K]")
    st = scale_type_of(scale_dtype, t, op)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_int8_per_channel(a.data, st))
    return run_gpu(a, s, _symmetric.run_rows, a.data, t, INT8, _symmetric.ZERO_IS_ONE,
                   _symmetric.NO_EPS, None, st)



def _q_block(a):
    m, k = a["x"].shape
    return [Out((m, k), "int8"), Out((m, cdiv(k, a["block_size"])), "float32")]

@declare(_q_block)
@replayable
def quantize_int8_per_block(x, block_size=128, *, stream=None, policy=DEFAULT_POLICY):
    """Quantize runs of `block_size` contiguous elements of each row to int8.

    Parameters
    ----------
    x : array [M, K], float16, bfloat16 or float32
    block_size : {32, 64, 128, 256}, default 128
        Elements per block along K; the last block of a row holds K % block_size.
    stream : optional, as in `quantize_int8_per_tensor`
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : int8 array [M, K]
    scale : float32 array [M, ceil(K / block_size)]
        One scale per block, row-major; 1.0 for an all-zero block.
    """
    op = "quantize_int8_per_block"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    bs = _block_size(block_size, op)
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    v.check_ndim(a, op, "x", 2, "[M, K]")
    if a.device == HOST:
        return host_results(a, _numpy.quantize_int8_per_block(a.data, bs))
    return run_gpu(a, s, _symmetric.run_groups, a.data, t, INT8, _symmetric.ZERO_IS_ONE, bs)



def _q_smooth(a):
    x = a["x"]
    return [Out(x.shape, "int8"), Out(x.shape[:-1], "float32")]

@declare(_q_smooth)
@replayable
def smooth_quant(x, smooth, *, stream=None, policy=DEFAULT_POLICY):
    """SmoothQuant activation quantization: divide each column by its smoothing factor,
    then quantize each row to int8.

    Parameters
    ----------
    x : array [M, K], float16 or bfloat16 (float32 is accepted too)
    smooth : float32 array [K]
        Per-channel smoothing factors; ``xs = f32(x) / smooth`` (IEEE division).
    stream : optional, as in `quantize_int8_per_tensor`
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : int8 array [M, K]
    scale : float32 array [M]
        ``amax(|xs[m]|) * f32(1/127)``, or 1.0 for an all-zero row; the multiplier of xs.
    """
    op = "smooth_quant"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    v.check_ndim(a, op, "x", 2, "[M, K]")
    b = intake(smooth, op, "smooth", s)
    v.check_float(b, op, "smooth", {"float32": FLOATS["float32"]})
    v.check_shape(b, op, "smooth", (a.data.shape[1],), "[K], K the columns of x")
    same_place(op, ("x", a), ("smooth", b))
    if a.device == HOST:
        return host_results(a, _numpy.smooth_quant(a.data, b.data))
    return run_gpu(a, s, _symmetric.run_rows, a.data, t, INT8, _symmetric.ZERO_IS_ONE,
                   _symmetric.NO_EPS, b.data, FLOATS["float32"], policy)



# ---------------------------------------------------------------------------------------
# Dequantization

def _dq(a):
    return [Out(a["q"].shape, float_named(a["dtype"]))]

@declare(_dq)
@replayable
def dequantize_int8_per_tensor(q, scale, dtype, *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize int8 codes with one scale: ``dtype(f32(q) * scale)``.

    Parameters
    ----------
    q : int8 array, any shape
    scale : float32 array of one element, shape () or (1,)
    dtype : float16, bfloat16 or float32 (NumPy, ml_dtypes, torch or JAX dtype, or name)
    stream : optional, as in `quantize_int8_per_tensor`
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`, shape of q
    """
    op = "dequantize_int8_per_tensor"
    policy = check_policy(policy, op)
    s, out, a, b = dequant_args(op, q, scale, dtype, stream, INT8)
    check_one_value(b, op)
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_int8_per_tensor(a.data, b.data, out))
    return run_gpu(a, s, _symmetric.run_dequantize, a.data, b.data, INT8, out, "tensor")




@declare(_dq)
@replayable
def dequantize_int8_per_channel(q, scale, dtype, *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize int8 codes with one scale per row: ``dtype(f32(q[n]) * scale[n])``.

    Parameters
    ----------
    q : int8 array [N, K]
    scale : float32 array [N]
    dtype : float16, bfloat16 or float32
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`, [N, K]
    """
    op = "dequantize_int8_per_channel"
    policy = check_policy(policy, op)
    s, out, a, b = dequant_args(op, q, scale, dtype, stream, INT8)
    v.check_ndim(a, op, "q", 2, "[N, K]")
    v.check_shape(b, op, "scale", (a.data.shape[0],), "[N], N the rows of q")
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_int8_per_channel(a.data, b.data, out))
    return run_gpu(a, s, _symmetric.run_dequantize, a.data, b.data, INT8, out, "row")




@declare(_dq)
@replayable
def dequantize_int8_per_block(q, scale, dtype, block_size=128,
                              *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize int8 codes with one scale per `block_size` elements of a row:
    ``x[m, k] = dtype(f32(q[m, k]) * scale[m, k // block_size])``.

    Parameters
    ----------
    q : int8 array [M, K]
    scale : float32 array [M, ceil(K / block_size)]
    dtype : float16, bfloat16 or float32
    block_size : {32, 64, 128, 256}, default 128
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`, [M, K]
    """
    op = "dequantize_int8_per_block"
    policy = check_policy(policy, op)
    bs = _block_size(block_size, op)
    s, out, a, b = dequant_args(op, q, scale, dtype, stream, INT8)
    v.check_ndim(a, op, "q", 2, "[M, K]")
    m, k = a.data.shape
    v.check_shape(b, op, "scale", (m, -(-k // bs)), f"[M, ceil(K / {bs})]")
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_int8_per_block(a.data, b.data, out, bs))
    return run_gpu(a, s, _symmetric.run_dequantize, a.data, b.data, INT8, out, "group", bs)
