"""torch CUDA tensors on torch's terms: every declared op gives the bits of the same call on
CuPy arrays, on torch's current stream and on a side stream; a call is ordered after its
stream's earlier work; calls captured by torch.cuda.graph and by CuPy replay to eager's
bits; torch.compile(fullgraph=True) equals eager."""

from __future__ import annotations

import numpy as np
import pytest

import op_table
from _util import assert_same_bits, framework_replays, op_variant_cases

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")

OPS = list(op_table.all_ops())
CASES = op_variant_cases(OPS)
SHAPES = ((16, 4096), (130, 7168))


def _to_torch(v):
    if isinstance(v, cp.ndarray):
        if v.dtype.name == "bfloat16":
            return torch.from_dlpack(v.view(np.int16)).view(torch.bfloat16).clone()
        return torch.from_dlpack(v).clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_torch(e) for e in v)
    return v


def _same(t, c):
    t = tuple(t) if isinstance(t, (tuple, list)) else (t,)
    c = tuple(c) if isinstance(c, (tuple, list)) else (c,)
    assert len(t) == len(c)
    for a, b in zip(t, c):
        assert_same_bits(a, b)


def _inputs(op, variant, rng, shape):
    args, kwargs = op.make(cp, rng, shape, op.dtypes[0], **variant)
    if "seed" in kwargs:
        kwargs = dict(kwargs, seed=99)
    return args, kwargs, [_to_torch(a) for a in args], {k: _to_torch(v) for k, v in kwargs.items()}


def _rolled(v):
    """v with each array's elements moved one place along (the same shapes and dtypes)."""
    if isinstance(v, torch.Tensor):
        return torch.roll(v.flatten(), 1).view(v.shape).clone()
    if isinstance(v, cp.ndarray):
        return cp.roll(v.ravel(), 1).reshape(v.shape)
    if isinstance(v, (list, tuple)):
        return type(v)(_rolled(e) for e in v)
    return v


def _new_inputs(op, variant, rng, args, kwargs):
    """Inputs for a captured call's replay: a new draw, or for the batched op (whose draw
    picks new shapes) the same arrays rolled; returned as _inputs returns them."""
    if op.name != "dequantize_groupwise_batched":
        return _inputs(op, variant, rng, (16, 4096))
    new, new_kw = _rolled(list(args)), _rolled(kwargs)
    return new, new_kw, new, new_kw


def _copy_into(old, new):
    for a, b in zip(old, new):
        if isinstance(a, torch.Tensor):
            a.copy_(b)
        elif isinstance(a, cp.ndarray):
            a[...] = b
        elif isinstance(a, (list, tuple)):
            _copy_into(a, b)


@pytest.mark.parametrize("op, variant", CASES)
def test_torch_in_equals_cupy_in(op, variant, rng):
    for shape in SHAPES:
        args, kwargs, targs, tkw = _inputs(op, variant, rng, shape)
        want = op.fn(*args, **kwargs)
        for _ in range(2):  # the whole way, then the replay
            _same(op.fn(*targs, **tkw), want)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                got = op.fn(*targs, **tkw)
        torch.cuda.current_stream().wait_stream(side)
        _same(got, want)


@pytest.mark.parametrize("op, variant",
                         op_variant_cases(OPS, skip=("dequantize_groupwise_batched",)))
def test_torch_dtypes_and_new_seeds_take_the_replay(op, variant, rng, monkeypatch):
    """Repeated calls with torch's own dtypes as arguments (torch.bfloat16), arrays given
    by name and a new seed each call go the whole way once, then run its replay (a call with
    a strided tensor is never keyed: the whole way each time, leaving nothing behind), and
    give the bits of the same call on CuPy arrays and the same dtypes every time."""
    seen, dtypes, (targs, tkw) = framework_replays(
        op, lambda: _inputs(op, variant, rng, (16, 4096)), torch, _same, monkeypatch)
    assert len(dtypes) == 1, dtypes  # replayed or not, the same dtypes
    strided = any(isinstance(a, torch.Tensor) and not a.is_contiguous()
                  for a in targs + list(tkw.values()))
    assert seen.count("torch") == (0 if strided else 1)


@pytest.mark.parametrize("name", ["quantize_mxfp4", "quantize_nvfp4"])
def test_float4_codes_on_the_gpu(name, rng):
    """codes_dtype='float4_e2m1fn_x2' on CUDA tensors: the whole way and its replays give
    torch.float4_e2m1fn_x2 codes over the uint8 codes' bytes; torch.compile too."""
    import cuquant as cq

    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    quantize = getattr(cq, name)
    for _ in range(3):
        x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
        want = quantize(x)
        got = quantize(x, codes_dtype=torch.float4_e2m1fn_x2)
        assert got[0].dtype == torch.float4_e2m1fn_x2
        _same((got[0].view(torch.uint8),) + tuple(got[1:]), want)
    torch._dynamo.reset()
    got = torch.compile(lambda t: quantize(t, codes_dtype="float4_e2m1fn_x2"),
                        fullgraph=True)(x)
    assert got[0].dtype == torch.float4_e2m1fn_x2
    _same((got[0].view(torch.uint8),) + tuple(got[1:]), want)


@pytest.mark.parametrize("op, variant", CASES)
def test_torch_graph_replays_eager(op, variant, rng):
    """Captured by torch.cuda.graph after a warm-up; replayed twice on new input, and on
    another stream; outputs equal an eager call on that input."""
    args, kwargs, targs, tkw = _inputs(op, variant, rng, (16, 4096))
    _, _, new_args, new_kw = _new_inputs(op, variant, rng, targs, tkw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op.fn(*targs, **tkw)  # warm-up: compile, plan
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op.fn(*targs, **tkw)
    _copy_into(targs + list(tkw.values()), new_args + list(new_kw.values()))
    want = op.fn(*new_args, **new_kw)
    g.replay()
    g.replay()
    _same(out, tuple(want) if isinstance(want, tuple) else want)
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):
        g.replay()
    torch.cuda.current_stream().wait_stream(other)
    torch.cuda.synchronize()
    _same(out, want)


def test_two_ops_graphs_on_one_stream(rng):
    """Per-tensor quantization (a grid-wide handshake in the stream's workspace) and
    SmoothQuant in two graphs captured on one stream, replayed one after the other."""
    import cuquant as cq

    x = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16)
    smooth = torch.rand(7168, device="cuda") + 0.5
    pol = cq.KernelPolicy(smooth_rows_min_elements=0, smooth_wide_min_elements=0)
    cq.quantize_int8_per_tensor(x)
    cq.smooth_quant(x, smooth, policy=pol)
    torch.cuda.synchronize()
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        a = cq.quantize_int8_per_tensor(x)
    with torch.cuda.graph(g2, stream=None):
        b = cq.smooth_quant(x, smooth, policy=pol)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g1.replay()
        g2.replay()
        g1.replay()
        _same(a, cq.quantize_int8_per_tensor(x))
        _same(b, cq.smooth_quant(x, smooth, policy=pol))


@pytest.mark.parametrize("op, variant", CASES)
def test_cupy_capture_replays_eager(op, variant, rng):
    args, kwargs, _, _ = _inputs(op, variant, rng, (16, 4096))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        op.fn(*args, **kwargs)
        s.synchronize()
        s.begin_capture()
        out = op.fn(*args, **kwargs)
        graph = s.end_capture()
        new, new_kw, _, _ = _new_inputs(op, variant, rng, args, kwargs)
        _copy_into(list(args) + list(kwargs.values()), list(new) + list(new_kw.values()))
        graph.launch(s)
        graph.launch(s)
        s.synchronize()
    _same(tuple(out) if isinstance(out, tuple) else out, op.fn(*new, **new_kw))


@pytest.mark.parametrize("op, variant", CASES)
def test_compile_equals_eager(op, variant, rng):
    args, kwargs, targs, tkw = _inputs(op, variant, rng, (16, 4096))

    def fn(*a):
        return op.fn(*a, **tkw)

    torch._dynamo.reset()
    _same(torch.compile(fn, fullgraph=True)(*targs), fn(*targs))


def test_call_is_ordered_on_its_stream():
    """A side stream sleeps, then writes the input; the call on that stream must see the
    write (a launch on another stream would read the old values)."""
    import cuquant as cq

    x = torch.zeros(16, 4096, device="cuda", dtype=torch.float16)
    cq.quantize_int8_per_channel(x)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        x.fill_(3.0)
        q, s = cq.quantize_int8_per_channel(x)
    torch.cuda.synchronize()
    # the scale of amax 3: f32(3 * f32(1/127)), the same bits in every row
    want = float(np.float32(3.0) * np.float32(1 / 127))
    assert bool((q == 127).all()) and bool(torch.equal(s, torch.full_like(s, want)))
