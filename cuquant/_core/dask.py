"""Dask arrays in, dask arrays out.

An op called with a `dask.array.Array` runs chunk by chunk, each chunk through the same op
(NumPy chunks on the NumPy backend, CuPy chunks on the GPU), on chunks cut where the op's
groups allow, so that the result equals the eager call on the whole array bit for bit:

- row formats (per channel, per row, per block, per token group, SmoothQuant, INT4 per
  group, the zero point): whole rows in a chunk (a group never spans rows);
- 128x128 tiles: whole rows, in runs of a multiple of 128;
- DeepSpeed's format: groups of the flattened tensor, so the flattened tensor in chunks of
  whole groups (and whole byte pairs for 4-bit codes);
- per tensor, dynamic: the amax is a reduction over every chunk first, then each chunk is
  quantized against the one scale;
- seeded stochastic rounding: each chunk takes the random words of its own elements.

Dask is imported only when a dask array arrives. Outputs are dask arrays of the chunks'
own family (NumPy or CuPy): nothing is computed until the caller asks.
"""

from __future__ import annotations

import inspect
import math
import sys

import numpy as np

# How each op's work is cut (see the module notes); ops not listed refuse dask arrays.
TENSOR, ROWS, TILES, FLAT, ELEMENTS = "tensor", "rows", "tiles", "flat", "elements"
RULES = {
    "quantize_int8_per_tensor": TENSOR,
    "quantize_fp8_per_tensor": TENSOR,
    "quantize_int8_per_channel": ROWS,
    "quantize_int8_per_block": ROWS,
    "smooth_quant": ROWS,
    "quantize_fp8_per_row": ROWS,
    "quantize_fp8_per_token_group": ROWS,
    "quantize_int4_per_group": ROWS,
    "quantize_groupwise_zero_point": ROWS,
    "dequantize_int8_per_channel": ROWS,
    "dequantize_int8_per_block": ROWS,
    "dequantize_fp8_per_row": ROWS,
    "dequantize_fp8_per_token_group": ROWS,
    "dequantize_int4_per_group": ROWS,
    "dequantize_groupwise_zero_point": ROWS,
    "quantize_fp8_per_block": TILES,
    "dequantize_fp8_per_block": TILES,
    "quantize_groupwise": FLAT,
    "dequantize_groupwise": FLAT,
    "dequantize_int8_per_tensor": ELEMENTS,
    "dequantize_fp8_per_tensor": ELEMENTS,
}


def is_dask(a) -> bool:
    """Whether `a` is a dask array (without importing dask)."""
    mod = type(a).__module__ or ""
    return mod.startswith("dask.") and "dask.array" in sys.modules and \
        isinstance(a, sys.modules["dask.array"].Array)


def call(fn, name: str, args: tuple, kwargs: dict):
    """`fn(*args, **kwargs)` for a dask array first argument: dask arrays of the results."""
    rule = RULES.get(name)
    if rule is None:
        raise TypeError(f"{name}: dask arrays are not taken by this function; pass a NumPy, "
                        "CuPy, torch or JAX array")
    if kwargs.get("stream") is not None:
        raise ValueError(f"{name}: stream= does not apply to dask arrays (each chunk runs on "
                         "its worker's current stream)")
    kwargs = {k: v for k, v in kwargs.items() if k != "stream"}
    return _RUNNERS[rule](fn, name, args, kwargs)


# ---------------------------------------------------------------------------------------
# Pieces

def _da():
    import dask.array as da

    return da


def _delayed(f):
    import dask

    return dask.delayed(f, pure=True)


def _on_gpu(x) -> bool:
    return type(x._meta).__module__.startswith("cupy")


def _meta_dtype(dtype, gpu: bool) -> np.dtype:
    """The dtype of a chunk's result: CuPy holds float8 codes as uint8."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint8) if gpu and dtype.name == "float8_e4m3fn" else dtype


def _meta(ndim: int, dtype, gpu: bool):
    if gpu:
        import cupy as cp

        return cp.empty((0,) * ndim, dtype=_meta_dtype(dtype, True))
    return np.empty((0,) * ndim, dtype=dtype)


def _is_dask(a) -> bool:
    return type(a).__module__.startswith("dask")


def _whole(a):
    """An argument that goes whole to every chunk (a smoothing vector, a scale of one
    value): a dask array is computed first."""
    return a.compute() if _is_dask(a) else a


def _host(a):
    a = _whole(a)
    return a.get() if hasattr(a, "get") else a


def _blocks(a, chunks):
    """The delayed chunks of `a` (a dask array rechunked, or an array wrapped) along
    `chunks` of its first axis, the other axes whole."""
    da = _da()
    full = (tuple(chunks),) + tuple((s,) for s in a.shape[1:])
    d = a.rechunk(full) if isinstance(a, da.Array) else da.from_array(a, chunks=full, asarray=False)
    return d.to_delayed().reshape(-1)


def _item(result, j):
    return result[j] if isinstance(result, tuple) else result


def _stack(pieces, shapes, dtype, gpu, axis=0):
    """One dask array of the j-th results of delayed calls, each of a known shape."""
    da = _da()
    parts = [da.from_delayed(p, shape=s, dtype=_meta_dtype(dtype, gpu), meta=_meta(len(s), dtype, gpu))
             for p, s in zip(pieces, shapes)]
    return parts[0] if len(parts) == 1 else da.concatenate(parts, axis=axis)


def _results(calls, specs, gpu):
    """calls: delayed results per chunk; specs: per output, (shape per chunk, dtype)."""
    outs = tuple(_stack([_delayed(_item)(c, j) for c in calls], shapes, dtype, gpu)
                 for j, (shapes, dtype) in enumerate(specs))
    return outs[0] if len(outs) == 1 else outs


def _as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


# ---------------------------------------------------------------------------------------
# Runners, one per rule

# Arguments of row ops cut with x's rows (each with as many rows per row of x as it has);
# every other argument goes whole to each chunk.
ALONG_ROWS = {
    "dequantize_int8_per_channel": ("scale",),
    "dequantize_int8_per_block": ("scale",),
    "dequantize_fp8_per_row": ("scale",),
    "dequantize_fp8_per_token_group": ("scale",),
    "dequantize_int4_per_group": ("params",),
    "quantize_groupwise_zero_point": ("rbits",),
    "dequantize_groupwise_zero_point": ("scales", "zeros"),
}


def _rows(fn, name, args, kwargs):
    """Whole rows a chunk, in the row counts of x's first chunks (leading axes of per-row
    ops flattened); the arguments in ALONG_ROWS are cut alike."""
    x = args[0]
    lead, k = x.shape[:-1], x.shape[-1]
    n = math.prod(lead)
    gpu = _on_gpu(x)
    x2 = x.reshape((n, k)) if x.ndim != 2 else x
    chunks = x2.chunks[0]
    x2 = x2.rechunk((chunks, (k,)))
    bound = inspect.signature(fn).bind(*args, **kwargs)
    arguments = dict(bound.arguments)
    del arguments[next(iter(arguments))]  # x
    seed = arguments.pop("seed", None) if name == "quantize_groupwise_zero_point" else None

    cut, probe_args = {}, {}
    for key, value in arguments.items():
        if key in ALONG_ROWS.get(name, ()) and value is not None:
            a = value.reshape((n,) + tuple(value.shape[len(lead):])) if len(lead) != 1 else value
            per = a.shape[0] // n if n else 1
            cut[key] = (_blocks(a, tuple(r * per for r in chunks)), per)
            probe_args[key] = _host(a[:per])
        else:
            arguments[key] = _whole(value)
            probe_args[key] = _host(arguments[key])
    if seed is not None:
        probe_args["rbits"] = np.zeros((1, k), np.uint32)
    # The op on one host row of zeros: each result's rows per row of x, and its dtype.
    probe = _as_tuple(fn(np.zeros((1, k), x.dtype), **probe_args))

    calls, shapes, start = [], [[] for _ in probe], 0
    for b, (block, rows) in enumerate(zip(x2.to_delayed().reshape(-1), chunks)):
        kb = {key: (cut[key][0][b] if key in cut else v) for key, v in arguments.items()}
        if seed is not None:
            kb["rbits"] = _delayed(_seeded_words)((rows, k), seed, start * k, gpu)
        calls.append(_delayed(fn)(block, **kb))
        for j, p in enumerate(probe):
            shapes[j].append((rows * p.shape[0],) + p.shape[1:])
        start += rows
    outs = _as_tuple(_results(calls, [(s, p.dtype) for s, p in zip(shapes, probe)], gpu))
    if x.ndim != 2:  # per-row ops of any rank: back to x's leading axes
        outs = tuple(o.reshape(tuple(lead) + o.shape[1:]) for o in outs)
    return outs if len(outs) > 1 else outs[0]


def _seeded_words(shape, seed, offset, gpu):
    """The random words `seed=` gives the elements of a chunk starting at `offset`."""
    from .._numpy.zero_point import random_bits

    words = random_bits(shape, seed, offset)
    if gpu:
        import cupy as cp

        return cp.asarray(words)
    return words


def _tiles(fn, name, args, kwargs):
    """128x128 tiles: whole rows in runs of a multiple of 128; a dequantizer's scale
    [ceil(N/128), ceil(K/128)] is cut with its tiles' rows."""
    x = args[0]
    n, k = x.shape
    gpu = _on_gpu(x)
    size = -(-max(x.chunks[0][0], 1) // 128) * 128
    chunks = (size,) * (n // size) + ((n % size,) if n % size else ()) or (0,)
    tiles = tuple(-(-r // 128) for r in chunks)
    blocks = x.rechunk((chunks, (k,))).to_delayed().reshape(-1)
    kt = -(-k // 128)
    if name.startswith("quantize"):
        probe = fn(np.zeros((1, k), x.dtype), *args[1:], **kwargs)
        calls = [_delayed(fn)(b, *args[1:], **kwargs) for b in blocks]
        return _results(calls, [([(r, k) for r in chunks], probe[0].dtype),
                                ([(t, kt) for t in tiles], probe[1].dtype)], gpu)
    sblocks = _blocks(args[1], tiles)
    probe = fn(np.zeros((1, k), x.dtype), np.ones((1, kt), np.float32), *args[2:], **kwargs)
    calls = [_delayed(fn)(b, s, *args[2:], **kwargs) for b, s in zip(blocks, sblocks)]
    return _results(calls, [([(r, k) for r in chunks], probe.dtype)], gpu)


def _tensor(fn, name, args, kwargs):
    """Per tensor: a given scale applies to every chunk as it is; a dynamic one is the op's
    own scale of the amax, reduced over every chunk first."""
    da = _da()
    x = args[0]
    gpu = _on_gpu(x)
    scale = args[1] if len(args) > 1 else kwargs.get("scale")
    kw = {key: v for key, v in kwargs.items() if key != "scale"}
    flat = x.reshape(-1)
    probe = fn(np.zeros((1,), x.dtype), **kw)
    if scale is None:
        amax = da.max(da.absolute(flat.astype(np.float32))) if flat.size else da.zeros((), np.float32)
        scale = _delayed(_scale_of_amax)(fn, amax, kw, gpu)
    else:
        scale = _whole(scale)
        fn(np.zeros((1,), x.dtype), scale=_host(scale), **kw)  # the op's own checks, now
        scale = _delayed(_given_scale)(scale, gpu)
    calls = [_delayed(_static_codes)(fn, b, scale, kw, gpu) for b in flat.to_delayed().reshape(-1)]
    q = _stack(calls, [(c,) for c in flat.chunks[0]], probe[0].dtype, gpu).reshape(x.shape)
    return q, _stack([scale], [(1,)], np.float32, gpu)


def _scale_of_amax(fn, amax, kw, gpu):
    """The op's scale of a tensor whose amax is `amax`: the op itself on that one value."""
    s = fn(np.asarray(_host(amax), dtype=np.float32).reshape(1), **kw)[1]
    return _given_scale(s, gpu)


def _given_scale(scale, gpu):
    s = np.asarray(_host(scale), dtype=np.float32).reshape(1)
    if gpu:
        import cupy as cp

        return cp.asarray(s)
    return s


def _static_codes(fn, block, scale, kw, gpu):
    """Codes of one chunk against the tensor's scale, a float32 array of one value that may
    be 0, NaN or inf (the op's device-scale path and the NumPy twin take it as it is)."""
    if gpu:
        return fn(block, scale=scale, **kw)[0]
    from .. import _numpy

    return getattr(_numpy, fn.__name__)(np.ascontiguousarray(block), scale)[0]


def _flat(fn, name, args, kwargs):
    """DeepSpeed's format: groups of the flattened tensor, so the flattened tensor in
    chunks of whole groups (and whole pairs of 4-bit codes), the codes shaped back."""
    x = args[0]
    gpu = _on_gpu(x)
    quantize = name.startswith("quantize")
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    bits, symmetric, group = (bound.arguments[a] for a in ("bits", "symmetric", "group_size"))
    pack = 2 if bits == 4 else 1
    unit = group * pack // math.gcd(group, pack)        # elements a chunk is a multiple of
    n = x.size * (1 if quantize else pack)
    first = math.prod(c[0] for c in x.chunks) * (1 if quantize else pack) if x.size else unit
    per = max(unit, first // unit * unit)
    counts = tuple([per] * (n // per) + ([n % per] if n % per else [])) or (0,)
    flat = x.reshape(-1).rechunk((tuple(c // (1 if quantize else pack) for c in counts),))
    blocks = flat.to_delayed().reshape(-1)
    width = 1 if symmetric else 2
    if quantize:
        probe = fn(np.zeros((unit,), x.dtype), *args[1:], **kwargs)
        calls = [_delayed(fn)(b, *args[1:], **kwargs) for b in blocks]
        q, p = _results(calls, [([(c // pack,) for c in counts], probe[0].dtype),
                                ([(c // group, width) for c in counts], probe[1].dtype)], gpu)
        return q.reshape(x.shape[:-1] + (x.shape[-1] // pack,) if x.ndim else (1,)), p
    pblocks = _blocks(args[1], tuple(c // group for c in counts))
    probe = fn(np.zeros((unit // pack,), x.dtype), np.ones((unit // group, width), np.float32),
               *args[2:], **kwargs)
    calls = [_delayed(fn)(b, p, *args[2:], **kwargs) for b, p in zip(blocks, pblocks)]
    out = _results(calls, [([(c,) for c in counts], probe.dtype)], gpu)
    return out.reshape(x.shape[:-1] + (x.shape[-1] * pack,))


def _elements(fn, name, args, kwargs):
    """Dequantization with one scale: any chunks."""
    x = args[0]
    gpu = _on_gpu(x)
    rest = [_whole(a) for a in args[1:]]
    probe = fn(np.zeros((1,), x.dtype), *[_host(a) for a in rest], **kwargs)
    return x.map_blocks(lambda b: fn(b, *rest, **kwargs), dtype=_meta_dtype(probe.dtype, gpu),
                        meta=_meta(x.ndim, probe.dtype, gpu))


_RUNNERS = {ROWS: _rows, TILES: _tiles, TENSOR: _tensor, FLAT: _flat, ELEMENTS: _elements}
