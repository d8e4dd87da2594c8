"""Group-wise integer quantization in DeepSpeed's format (docs/formats.md section 5), INT4 per group
(TileOPs' INT4QuantPerGroupFwdOp), and batched dequantization.

Groups are runs of `group_size` consecutive elements of the C-order flattened tensor; any
group size that divides the size works. Per group, with lo/hi its minimum/maximum and
m = max|x|:

- symmetric: ``mult = 1 if m == 0 else f32(2**bits) / f32(2 m)``, params ``[1 / mult]``,
  ``q = clamp(rne(x * mult), -2**(bits-1), 2**(bits-1) - 1)``;
- asymmetric: ``mult = 1 if hi == lo else f32(2**bits) / (hi - lo)``,
  ``offset = (hi + lo) * 0.5``, params ``[1 / mult, offset]``,
  ``q = clamp(rne((x - offset) * mult), ...)``.

A NaN product gives code 0. 4-bit codes are packed two a byte, the first element of each
pair in the high nibble (int8 storage). Dequantization is ``dtype(f32(q) * p0)``
(symmetric) or ``dtype(f32(f32(q) * p0) + p1)`` (asymmetric).

"""

from __future__ import annotations

from . import _numpy
from ._core import replay as _fast
from ._core.declare import Out, cdiv, declare, dtype_name, float_named
from ._core.arrays import HOST
from ._core.call import host_results, intake, out_dtype, same_place, stream_of, v
from ._core.dtypes import FLOATS
from ._cuda import groupwise as _gpu_groupwise
from ._cuda.launch import run as run_gpu
from ._cuda.policy import DEFAULT_POLICY, check_policy

__all__ = ["quantize_groupwise", "dequantize_groupwise", "dequantize_groupwise_batched",
           "quantize_int4_per_group", "dequantize_int4_per_group"]


# ---------------------------------------------------------------------------------------
# Public ops

def _q_groupwise(a):
    x, bits = a["x"], a["bits"]
    shape = tuple(x.shape)
    n = 1
    for d in shape:
        n *= d
    q = shape[:-1] + (shape[-1] // 2,) if bits == 4 else shape
    return [Out(q, "int8"), Out((n // a["group_size"], 1 if a["symmetric"] else 2), "float32")]

@declare(_q_groupwise)
@_fast.replayable
def quantize_groupwise(x, bits, symmetric, group_size, *, stream=None, policy=DEFAULT_POLICY):
    """Quantize groups of consecutive elements to 4- or 8-bit integers, DeepSpeed's format.

    Parameters
    ----------
    x : array, any shape, float16, bfloat16 or float32
        NumPy, CuPy, PyTorch, JAX or any DLPack array. Groups are runs of `group_size`
        elements of x flattened in C order.
    bits : {4, 8}
    symmetric : bool
        True: one multiplier per group from max|x|. False: a multiplier from the range
        ``hi - lo`` and an offset ``(hi + lo) / 2``.
    group_size : int >= 1
        Must divide ``x.size``; need not be a multiple of 8, nor <= 16384.
    stream : CuPy stream, torch.cuda.Stream or int, optional
        Stream of a GPU call; the current CuPy stream by default.
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    q : int8 array
        bits=8: shape of x, codes in [-128, 127]. bits=4: shape
        ``x.shape[:-1] + (x.shape[-1] // 2,)`` (the last axis of x must be even), two codes
        in [-8, 7] a byte, the first of each pair in the high nibble.
    params : float32 array [x.size // group_size, 1] (symmetric) or [..., 2] (asymmetric)
        ``[1 / mult]`` or ``[1 / mult, offset]`` per group: ``x ~= q * p0 (+ p1)``.
    """
    op = "quantize_groupwise"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    b = v.check_bits(bits, op)
    sym = v.check_bool(symmetric, op, "symmetric")
    a = intake(x, op, "x", s)
    t = v.check_float(a, op, "x")
    g = v.check_group_size(group_size, op, a.data.size)
    v.check_even_last(a, op, "x", b)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_groupwise(a.data, b, sym, g))
    return run_gpu(a, s, _gpu_groupwise.quantize, a.data, t, b, sym, g, policy)


def _dequant_checks(op, a, params, bits, symmetric, group_size, dtype, s, q_arg="q",
                    prefix=""):
    """Checks of a dequantizer whose codes `a` (taken in) are DeepSpeed codes; `prefix`
    names the item of a batch."""
    b = v.check_bits(bits, op, prefix + "bits")
    sym = v.check_bool(symmetric, op, prefix + "symmetric")
    out = out_dtype(dtype, op)
    v.check_exact_dtype(a, op, q_arg, _gpu_groupwise.code_dtype(b))
    if b == 4 and a.data.ndim == 0:
        raise ValueError(f"{op}: {q_arg} must have at least one axis for bits=4; got shape ()")
    n = a.data.size * (2 if b == 4 else 1)
    g = v.check_group_size(group_size, op, n, f"the element count of {q_arg}",
                           prefix + "group_size")
    p_arg = prefix + "params"
    p = intake(params, op, p_arg, s)
    v.check_float(p, op, p_arg, {"float32": FLOATS["float32"]})
    v.check_shape(p, op, p_arg, (n // g, 1 if sym else 2),
                  f"[groups, {'1' if sym else '2'}] ({'symmetric' if sym else 'asymmetric'}, "
                  f"{n // g} groups of {g})")
    same_place(op, (q_arg, a), (p_arg, p))
    return b, sym, out, p, g


def _dq_groupwise(a):
    shape = tuple(a["q"].shape)
    if a["bits"] == 4:
        shape = shape[:-1] + (2 * shape[-1],)
    return [Out(shape, float_named(a["dtype"]))]

@declare(_dq_groupwise)
@_fast.replayable
def dequantize_groupwise(q, params, bits, symmetric, group_size, dtype,
                         *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize the codes of `quantize_groupwise`.

    Parameters
    ----------
    q : int8 array
        bits=8: one code a byte; bits=4: two a byte, first element in the high nibble.
    params : float32 array [groups, 1] (symmetric) or [groups, 2] (asymmetric)
        groups = elements / group_size, elements = q.size (bits=8) or 2 * q.size (bits=4).
    bits : {4, 8}
    symmetric : bool
    group_size : int >= 1
    dtype : float16, bfloat16 or float32 (NumPy, ml_dtypes, torch or JAX dtype, or name)
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    x : array of `dtype`
        Shape of q, the last axis doubled for bits=4. Symmetric ``dtype(f32(q) * p0)``,
        asymmetric ``dtype(f32(f32(q) * p0) + p1)``.
    """
    op = "dequantize_groupwise"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    a = intake(q, op, "q", s)
    b, sym, out, p, g = _dequant_checks(op, a, params, bits, symmetric, group_size, dtype, s)
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_groupwise(a.data, p.data, b, sym, g, out))
    return run_gpu(a, s, _gpu_groupwise.dequantize, a.data, p.data, b, sym, g, out,
                   policy)


def _q_int4(a):
    n, k = a["w"].shape
    return [Out((n, k // 2), "int8"), Out((n * k // a["group_size"], 2), "float32")]

@declare(_q_int4)
@_fast.replayable
def quantize_int4_per_group(w, group_size=128, *, stream=None, policy=DEFAULT_POLICY):
    """TileOPs' INT4QuantPerGroupFwdOp: asymmetric 4-bit groups along K of a weight.

    Parameters
    ----------
    w : array [N, K], float16, bfloat16 or float32
        K must be even and a multiple of `group_size`.
    group_size : int >= 1, default 128
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    packed : int8 array [N, K / 2]
        Codes in [-8, 7], the first of each pair in the high nibble.
    params : float32 array [N * K / group_size, 2]
        ``[1 / mult, offset]`` per group, row-major over (n, k // group_size).
    """
    op = "quantize_int4_per_group"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    a = intake(w, op, "w", s)
    t = v.check_float(a, op, "w")
    v.check_ndim(a, op, "w", 2, "[N, K]")
    k = a.data.shape[1]
    g = v.check_group_size(group_size, op, k, "K, the columns of w")
    v.check_even_last(a, op, "w", 4)
    if a.device == HOST:
        return host_results(a, _numpy.quantize_int4_per_group(a.data, g))
    return run_gpu(a, s, _gpu_groupwise.quantize, a.data, t, 4, False, g, policy)


def _dq_int4(a):
    n, kh = a["packed"].shape
    return [Out((n, 2 * kh), float_named(a["dtype"]))]

@declare(_dq_int4)
@_fast.replayable
def dequantize_int4_per_group(packed, params, dtype, group_size=128,
                              *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize `quantize_int4_per_group`: ``dtype(f32(f32(q) * p0) + p1)``.

    Parameters
    ----------
    packed : int8 array [N, K / 2]
    params : float32 array [N * K / group_size, 2]
    dtype : float16, bfloat16 or float32
    group_size : int >= 1, default 128 (must divide K)
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    w : array of `dtype`, [N, K]
    """
    op = "dequantize_int4_per_group"
    policy = check_policy(policy, op)
    s = stream_of(stream, op)
    a = intake(packed, op, "packed", s)
    v.check_ndim(a, op, "packed", 2, "[N, K / 2]")
    k = 2 * a.data.shape[1]
    v.check_group_size(group_size, op, k, "K = 2 * packed.shape[1]")
    _, _, out, p, g = _dequant_checks(op, a, params, 4, False, group_size, dtype, s, q_arg="packed")
    if a.device == HOST:
        return host_results(a, _numpy.dequantize_int4_per_group(a.data, p.data, out, g))
    return run_gpu(a, s, _gpu_groupwise.dequantize, a.data, p.data, 4, False, g, out,
                   policy)


# ---------------------------------------------------------------------------------------
# Batched dequantization

_ITEM_KEYS = ("q", "params", "bits", "symmetric", "group_size")


def _item_fields(item, op: str, i: int):
    if isinstance(item, dict):
        missing = [k for k in _ITEM_KEYS if k not in item]
        if missing:
            raise ValueError(f"{op}: items[{i}] lacks {', '.join(missing)}; each item needs "
                             f"{', '.join(_ITEM_KEYS)}")
        return tuple(item[k] for k in _ITEM_KEYS)
    if isinstance(item, (tuple, list)) and len(item) == 5:
        return tuple(item)
    raise TypeError(f"{op}: items[{i}] must be a tuple (q, params, bits, symmetric, group_size) "
                    f"or a dict with those keys; got {type(item).__name__}"
                    + (f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""))


def _dq_batched(a):
    out = float_named(a["dtype"])
    res = []
    for i, item in enumerate(a["items"]):
        q, _p, bits, _s, _g = _item_fields(item, "dequantize_groupwise_batched", i)
        shape = tuple(q.shape)
        res.append(Out(shape[:-1] + (shape[-1] * 2,) if bits == 4 else shape, out))
    return res


def _first_q(items):
    """The first item's q when it is an array of torch or JAX (else None)."""
    if type(items) not in (list, tuple) or not items:
        return None
    item = items[0]
    q = item.get("q") if isinstance(item, dict) else (
        item[0] if isinstance(item, (tuple, list)) and item else None)
    return q if type(q).__module__.startswith(("torch", "jax")) else None


@declare(_dq_batched, many=True)
def dequantize_groupwise_batched(items, dtype, *, stream=None, policy=DEFAULT_POLICY):
    """Dequantize many tensors of `quantize_groupwise` in one kernel launch.

    Parameters
    ----------
    items : sequence of (q, params, bits, symmetric, group_size) tuples, or of dicts with
        those keys
        Each item is what `dequantize_groupwise` takes; sizes, group sizes, bit widths and
        symmetries may all differ. Every q and params must live on one device (or all on
        the host).
    dtype : float16, bfloat16 or float32
        The output dtype of every item.
    stream : optional
    policy : KernelPolicy, optional
        Which kernels run on a GPU (see `cuquant.KernelPolicy`); never changes the result.

    Returns
    -------
    list of arrays of `dtype`
        ``dequantize_groupwise(*item, dtype)`` for each item, in order, each in the array
        family of its q. On a GPU every 63 items with work cost one kernel launch, its table
        of addresses and sizes passed as the kernel's argument (nothing is copied to the
        device, so a call can be captured in a CUDA graph).
    """
    op = "dequantize_groupwise_batched"
    first = _first_q(items)
    if first is not None:  # traced by torch.compile or jax.jit: the op as a whole
        routed = _fast.traced_route(dequantize_groupwise_batched, first, (items, dtype),
                                    {"stream": stream, "policy": policy})
        if routed is not _fast.NOT_TRACED:
            return routed
    policy = check_policy(policy, op)
    batch = _batch_key(items, dtype, policy) if stream is None else None
    if batch is not None:
        key, ptrs = batch
        replay = _fast.replay_of(key)
        if replay is not None and _fast.current_device() == key[1]:
            return replay(_fast.current_stream(), ptrs)
    if isinstance(items, (dict, str, bytes)) or not hasattr(items, "__len__"):
        raise TypeError(f"{op}: items must be a sequence of (q, params, bits, symmetric, "
                        f"group_size) items; got {type(items).__name__}")
    s = stream_of(stream, op)
    out = out_dtype(dtype, op)
    checked = []
    for i, item in enumerate(items):
        q, params, bits, symmetric, group_size = _item_fields(item, op, i)
        a = intake(q, op, f"items[{i}].q", s)
        b, sym, _, p, g = _dequant_checks(op, a, params, bits, symmetric, group_size, dtype, s,
                                          q_arg=f"items[{i}].q", prefix=f"items[{i}].")
        checked.append((a, p, b, sym, g))
    if not checked:
        return []
    first = checked[0][0]
    for i, (a, p, *_rest) in enumerate(checked[1:], 1):
        same_place(op, ("items[0].q", first), (f"items[{i}].q", a))
    if first.device == HOST:
        return [host_results(a, _numpy.dequantize_groupwise(a.data, p.data, b, sym, g, out))
                for a, p, b, sym, g in checked]
    return _gpu_groupwise.batched(checked, out, s, batch)


def _batch_key(items, dtype, policy=DEFAULT_POLICY):
    """(key, addresses) of a batch that can be replayed (cuquant._core.replay): a list or tuple of
    (q, params, bits, symmetric, group_size) tuples of C-contiguous CuPy arrays on one
    device, with int bits and group size and a bool symmetry; None for any other batch. The
    key holds each item's shapes, dtypes, alignments and values, and the dtype argument."""
    nd = _fast.ND
    if nd is None or type(items) not in (list, tuple) or not items or not _fast.plain(dtype):
        return None
    parts, ptrs, device = [type(dtype), dtype, policy], [], None
    for item in items:
        if type(item) is not tuple or len(item) != 5:
            return None
        q, p, bits, sym, g = item
        if (type(q) is not nd or type(p) is not nd or not q._c_contiguous or not p._c_contiguous
                or type(bits) is not int or type(sym) is not bool or type(g) is not int):
            return None
        qd, pd = q.data, p.data
        if device is None:
            device = qd.device_id
        if qd.device_id != device or pd.device_id != device:
            return None
        qp, pp = qd.ptr, pd.ptr
        parts += (q.shape, q.dtype, qp & 15, p.shape, p.dtype, pp & 15, bits, sym, g)
        ptrs.append((qp, pp))
    return (dequantize_groupwise_batched, device, tuple(parts)), ptrs  # key[1]: the device


