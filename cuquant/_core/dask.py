"""Dask arrays in, dask arrays out.

An op called with a `dask.array.Array` runs chunk by chunk, each chunk through the same op
(NumPy chunks on the NumPy backend, CuPy chunks on the GPU), on chunks cut where the op's
groups allow, so that the result equals the eager call on the whole array bit for bit:

- row formats (per channel, per row, per block, per token group, SmoothQuant, INT4 per
  group, the zero point, MXFP8, MXFP4, NVFP4): whole rows in a chunk (a group never spans
  rows);
- 128x128 tiles: whole rows, in runs of a multiple of 128;
- microscaling scales in the swizzled layout (1-D, each 128-row tile's scales contiguous,
  the padding rows of a partial tile its own): whole rows in runs of a multiple of 128, so
  that each chunk's swizzled scales are the next tiles' slice of the whole array's, and a
  dequantizer's 1-D scales are cut in the same tiles;
- DeepSpeed's format: groups of the flattened tensor, so the flattened tensor in chunks of
  whole groups (and whole byte pairs for 4-bit codes);
- per tensor, dynamic: the amax is a reduction over every chunk first, then each chunk is
  quantized against the one scale; NVFP4's global amax likewise, each chunk of rows given
  it (a given global amax goes to every chunk as it is);
- seeded stochastic rounding: each chunk takes the random words of its own elements (the
  words of `seed=` are a function of the element's index in the whole tensor, C order),
  passed to it as `rbits=`.

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
    "quantize_mxfp8": ROWS,
    "quantize_mxfp4": ROWS,
    "quantize_nvfp4": ROWS,
    "dequantize_int8_per_channel": ROWS,
    "dequantize_int8_per_block": ROWS,
    "dequantize_fp8_per_row": ROWS,
    "dequantize_fp8_per_token_group": ROWS,
    "dequantize_int4_per_group": ROWS,
    "dequantize_groupwise_zero_point": ROWS,
    "dequantize_mxfp8": ROWS,
    "dequantize_mxfp4": ROWS,
    "dequantize_nvfp4": ROWS,
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
    """The dtype of a chunk's result: CuPy holds float8 codes and E8M0 scales as uint8."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint8) if gpu and dtype.name.startswith("float8") else dtype


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

# Arguments of row ops cut with x's rows (each with as many rows per row of x as it has, or
# in 128-row tiles where SWIZZLED names it); every other argument goes whole to each chunk.
ALONG_ROWS = {
    "dequantize_int8_per_channel": ("scale",),
    "dequantize_int8_per_block": ("scale",),
    "dequantize_fp8_per_row": ("scale",),
    "dequantize_fp8_per_token_group": ("scale",),
    "dequantize_int4_per_group": ("params",),
    "quantize_groupwise_zero_point": ("rbits",),
    "dequantize_groupwise_zero_point": ("scales", "zeros"),
    "quantize_mxfp4": ("rbits",),
    "quantize_nvfp4": ("rbits",),
    "dequantize_mxfp8": ("scales",),
    "dequantize_mxfp4": ("scales",),
    "dequantize_nvfp4": ("scales",),
}

# Row ops that take x of any rank, its leading axes the rows; the others take matrices.
ANY_RANK = ("quantize_fp8_per_row", "dequantize_fp8_per_row")

# Row ops whose `seed=` draws each element's word from its index in the whole tensor (C
# order, `random_bits(shape, seed, offset)`): a chunk is given its own elements' words as
# `rbits=`.
SEEDED = ("quantize_groupwise_zero_point", "quantize_mxfp4", "quantize_nvfp4")

# Row ops whose scales may take the swizzled layout (docs/formats.md section 9), 1-D with
# each 128-row tile's scales contiguous: the quantizer's output of this index when
# scale_layout="swizzled", the dequantizer's argument of this name when it is 1-D. The rows
# then go in runs of a multiple of 128, and those scales in the same runs of tiles.
SWIZZLED = {
    "quantize_mxfp8": 1,
    "quantize_mxfp4": 1,
    "quantize_nvfp4": 1,
    "dequantize_mxfp8": "scales",
    "dequantize_mxfp4": "scales",
    "dequantize_nvfp4": "scales",
}

# Row ops with one value of the whole tensor: (argument, output index). Given, it goes to
# every chunk as it is; not given, it is max |x| reduced over every chunk first (as the
# per-tensor rule does) and then given to every chunk. The op returns it once, [1].
TENSOR_AMAX = {"quantize_nvfp4": ("global_amax", 2)}

TILE = 128


def _swizzled(name, arguments) -> bool:
    where = SWIZZLED.get(name)
    if isinstance(where, int):
        return arguments.get("scale_layout") == "swizzled"
    return where is not None and getattr(arguments.get(where), "ndim", None) == 1


def _runs(chunks, n, unit):
    """Chunks of `n` rows in whole runs of `unit` rows (the last one partial), about as long
    as the first of `chunks`."""
    size = -(-max(chunks[0], 1) // unit) * unit
    return (size,) * (n // size) + ((n % size,) if n % size else ()) or (0,)


def _on_device(a) -> bool:
    return hasattr(a, "__cuda_array_interface__")


def _rows(fn, name, args, kwargs):
    """Whole rows a chunk, in the row counts of x's first chunks (the leading axes of ANY_RANK
    ops flattened), or in runs of a multiple of 128 rows for swizzled scales; the arguments
    in ALONG_ROWS are cut alike."""
    x = args[0]
    bound = inspect.signature(fn).bind(*args, **kwargs)
    arguments = dict(bound.arguments)
    first = next(iter(arguments))
    del arguments[first]  # x
    if x.ndim != 2 and name not in ANY_RANK:
        raise ValueError(f"{name}: {first} must be a 2-D array; got shape {tuple(x.shape)}")
    lead, k = x.shape[:-1], x.shape[-1]
    n = math.prod(lead)
    gpu = _on_gpu(x)
    x2 = x.reshape((n, k)) if x.ndim != 2 else x
    tiled = _swizzled(name, arguments)
    chunks = _runs(x2.chunks[0], n, TILE) if tiled else x2.chunks[0]
    x2 = x2.rechunk((chunks, (k,)))
    tiles = tuple(-(-r // TILE) for r in chunks)
    one = 1 if n else 0   # rows of the probe
    seed = arguments.pop("seed", None) if name in SEEDED else None
    amax_key, amax_out = TENSOR_AMAX.get(name, (None, None))
    reduce = amax_key is not None and arguments.get(amax_key) is None
    if reduce:
        arguments.pop(amax_key, None)

    cut, probe_args = {}, {}
    for key, value in arguments.items():
        if key in ALONG_ROWS.get(name, ()) and value is not None:
            if tiled and key == SWIZZLED[name]:
                per = value.shape[0] // sum(tiles) if n else 0
                if value.shape[0] != per * sum(tiles):
                    raise ValueError(f"{name}: {key} (swizzled) must hold as many bytes for each "
                                     f"of x's {sum(tiles)} tiles of {TILE} rows; got shape "
                                     f"{tuple(value.shape)}")
                cut[key] = _blocks(value, tuple(t * per for t in tiles))
                probe_args[key] = _host(value[:per * one])
                continue
            a = value.reshape((n,) + tuple(value.shape[len(lead):])) if len(lead) != 1 else value
            per = a.shape[0] // n if n else 1
            if a.shape[0] != per * n:
                raise ValueError(f"{name}: {key} must have as many rows for each of x's {n} "
                                 f"rows; got shape {tuple(value.shape)}")
            cut[key] = _blocks(a, tuple(r * per for r in chunks))
            probe_args[key] = _host(a[:per * one])
        else:
            arguments[key] = _whole(value)
            # A tensor value on the device is not read (nor checked) by the op.
            device = key == amax_key and _on_device(arguments[key])
            probe_args[key] = None if device else _host(arguments[key])
    if seed is not None:
        probe_args["seed"] = seed
    # The op on `one` host row of zeros: each result's rows per row of x (or per tile of
    # swizzled scales), its dtype, and the op's refusals of the other arguments, now.
    try:
        probe = _as_tuple(fn(np.zeros((one, k), x.dtype), **probe_args))
    except (TypeError, ValueError) as e:
        raise type(e)(f"{e} (checked on one row of {first}, a dask array of shape "
                      f"{tuple(x.shape)})") from None

    amax = _delayed(_tensor_value)(_abs_max(x2), gpu) if reduce else None
    calls, start = [], 0
    for b, (block, rows) in enumerate(zip(x2.to_delayed().reshape(-1), chunks)):
        kb = {key: (cut[key][b] if key in cut else v) for key, v in arguments.items()}
        if seed is not None:
            kb["rbits"] = _delayed(_seeded_words)((rows, k), seed, start * k, gpu)
        if reduce:
            calls.append(_delayed(_with_tensor_value)(fn, block, amax_key, amax, kb, gpu))
        else:
            calls.append(_delayed(fn)(block, **kb))
        start += rows

    outs = []
    for j, p in enumerate(probe):
        if j == amax_out:  # one value, whole: the reduced one, or what the op returns
            outs.append(_stack([amax if reduce else _delayed(_item)(calls[0], j)], [(1,)],
                               p.dtype, gpu))
            continue
        if tiled and j == SWIZZLED[name]:
            shapes = [(t * p.shape[0],) for t in tiles]
        else:
            shapes = [(r * p.shape[0],) + p.shape[1:] for r in chunks]
        outs.append(_stack([_delayed(_item)(c, j) for c in calls], shapes, p.dtype, gpu))
    if x.ndim != 2:  # per-row ops of any rank: back to x's leading axes
        outs = [o.reshape(tuple(lead) + o.shape[1:]) for o in outs]
    return tuple(outs) if len(outs) > 1 else outs[0]


def _abs_max(a):
    """max |a| over every chunk, float32 (a NaN anywhere gives NaN; empty, 0)."""
    da = _da()
    return da.max(da.absolute(a.astype(np.float32))) if a.size else da.zeros((), np.float32)


def _tensor_value(amax, gpu):
    """A reduced amax as the ops return it: float32 [1], NaN as the canonical 0x7FFFFFFF."""
    a = np.asarray(_host(amax), dtype=np.float32).reshape(1).copy()
    a.view(np.uint32)[np.isnan(a)] = 0x7FFFFFFF
    if gpu:
        import cupy as cp

        return cp.asarray(a)
    return a


def _with_tensor_value(fn, block, key, value, kw, gpu):
    """The op on one chunk given the tensor's reduced value, which may be 0, NaN or inf: the
    op takes a device array as it is; on the host (where the op takes only a positive
    finite value from the caller) its NumPy twin, which the op runs there anyway."""
    if gpu:
        return fn(block, **{key: value}, **kw)
    from .. import _numpy

    kw = {a: v for a, v in kw.items() if a != "policy"}
    return getattr(_numpy, fn.__name__)(np.ascontiguousarray(block),
                                        **{key: value.reshape(())[()]}, **kw)


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
    if x.ndim != 2:
        first = next(iter(inspect.signature(fn).parameters))
        raise ValueError(f"{name}: {first} must be a 2-D array; got shape {tuple(x.shape)}")
    n, k = x.shape
    gpu = _on_gpu(x)
    chunks = _runs(x.chunks[0], n, TILE)
    tiles = tuple(-(-r // TILE) for r in chunks)
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
    x = args[0]
    gpu = _on_gpu(x)
    scale = args[1] if len(args) > 1 else kwargs.get("scale")
    kw = {key: v for key, v in kwargs.items() if key != "scale"}
    flat = x.reshape(-1)
    probe = fn(np.zeros((1,), x.dtype), **kw)
    if scale is None:
        scale = _delayed(_scale_of_amax)(fn, _abs_max(flat), kw, gpu)
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
