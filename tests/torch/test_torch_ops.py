"""torch on the CPU: every declared op as a torch custom op, its fake outputs those of real
calls, torch.compile(fullgraph=True) giving eager's bits, and `import cuquant` loading
neither torch nor JAX."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import cuquant as cq
from _util import assert_refused, assert_same_bits, op_variant_cases
import op_table
from cuquant._core import declare

torch = pytest.importorskip("torch")

OPS = list(op_table.all_ops())
CASES = op_variant_cases(OPS)
SHAPE = (16, 512)


def _as_torch(v):
    if isinstance(v, np.ndarray):
        if v.dtype.name == "bfloat16":
            return torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
        if v.dtype.itemsize == 1 and v.dtype.name.startswith("float8"):  # e4m3 codes, E8M0
            return torch.from_numpy(v.view(np.uint8).copy()).view(getattr(torch, v.dtype.name))
        return torch.from_numpy(v.copy())
    if isinstance(v, (list, tuple)):
        return type(v)(_as_torch(e) for e in v)
    return v


def _inputs(op, variant, rng, dtype=None):
    args, kwargs = op.make(np, rng, SHAPE, dtype or op.dtypes[0], **variant)
    return [_as_torch(a) for a in args], {k: _as_torch(v) for k, v in kwargs.items()}


def _strides(t):
    """Strides of the axes longer than one (the others' do not address anything)."""
    return tuple(s for s, n in zip(t.stride(), t.shape) if n > 1)


def _same(a, b):
    a = list(a) if isinstance(a, (tuple, list)) else [a]
    b = list(b) if isinstance(b, (tuple, list)) else [b]
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and _strides(x) == _strides(y)
        assert_same_bits(x, y)


def test_every_public_op_is_declared():
    public = {n for n in cq.__all__ if callable(getattr(cq, n)) and not isinstance(
        getattr(cq, n), type) and n != "DEFAULT_POLICY"}
    assert public == set(declare.OPS)


@pytest.mark.parametrize("op, variant", CASES)
def test_declared_outputs_are_the_real_ones(op, variant, rng):
    """The fake implementation's shapes, dtypes and strides are those of a real call."""
    for dtype in op.dtypes:
        args, kwargs = _inputs(op, variant, rng, dtype)
        real = op.fn(*args, **kwargs)
        real = real if isinstance(real, (tuple, list)) else (real,)
        from cuquant._core import torch_ops

        torch_ops.register()
        tensors: list = []
        spec = torch_ops._encode(torch_ops._split(tuple(args), tensors),
                                 torch_ops._split(kwargs, tensors))
        fake = torch_ops._fake(op.fn, tensors, spec)
        assert [(r.shape, r.dtype, _strides(r)) for r in real] == \
            [(f.shape, f.dtype, _strides(f)) for f in fake]


@pytest.mark.parametrize("op, variant", CASES)
def test_custom_op_gives_the_public_functions_bits(op, variant, rng):
    from cuquant._core import torch_ops

    torch_ops.register()
    args, kwargs = _inputs(op, variant, rng)
    tensors: list = []
    spec = torch_ops._encode(torch_ops._split(tuple(args), tensors),
                             torch_ops._split(kwargs, tensors))
    outs = getattr(torch.ops.cuquant, op.name)(tensors, spec)
    _same(tuple(outs) if len(outs) > 1 else outs[0], op.fn(*args, **kwargs))


@pytest.mark.parametrize("op, variant", CASES)
def test_compile_fullgraph_equals_eager(op, variant, rng):
    args, kwargs = _inputs(op, variant, rng)
    if "seed" in kwargs:
        kwargs = dict(kwargs, seed=1234)  # a constant of the compiled function

    def fn(*a):
        return op.fn(*a, **kwargs)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    _same(compiled(*args), fn(*args))


def test_compile_takes_a_policy_and_torch_dtypes(rng):
    x = _as_torch(op_table.float_input(np, rng, SHAPE, "float32"))
    policy = cq.KernelPolicy(tiles=False)

    def fn(x):
        q, p = cq.quantize_groupwise(x, 8, True, 128, policy=policy)
        return cq.dequantize_groupwise(q, p, 8, True, 128, torch.bfloat16, policy=policy)

    torch._dynamo.reset()
    _same(torch.compile(fn, fullgraph=True)(x), fn(x))


@pytest.mark.parametrize("quantize", [cq.quantize_mxfp4, cq.quantize_nvfp4])
def test_packed_fp4_codes_as_torchs_float4_pairs(quantize, rng):
    """codes_dtype='float4_e2m1fn_x2' (or torch's dtype itself): the codes come back as
    torch.float4_e2m1fn_x2 over the bytes of the uint8 codes, eagerly and compiled, and the
    dequantizers take them; any other family, and any other name, is refused."""
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    x = _as_torch(op_table.float_input(np, rng, SHAPE, "bfloat16"))
    want = quantize(x)
    for codes_dtype in ("float4_e2m1fn_x2", torch.float4_e2m1fn_x2):
        torch._dynamo.reset()
        for got in (quantize(x, codes_dtype=codes_dtype),
                    torch.compile(lambda t: quantize(t, codes_dtype=codes_dtype),
                                  fullgraph=True)(x)):
            assert got[0].dtype == torch.float4_e2m1fn_x2
            _same((got[0].view(torch.uint8),) + tuple(got[1:]), tuple(want))
    q, s = quantize(x, codes_dtype="float4_e2m1fn_x2")[:2]
    if quantize is cq.quantize_mxfp4:
        _same(cq.dequantize_mxfp4(q, s, torch.float32), cq.dequantize_mxfp4(want[0], s, "float32"))
    else:
        amax = want[2]
        _same(cq.dequantize_nvfp4(q, s, amax, torch.float32),
              cq.dequantize_nvfp4(want[0], s, amax, "float32"))
    assert_refused(quantize, (x.float().numpy(),), {"codes_dtype": "float4_e2m1fn_x2"},
                   ValueError, ["codes_dtype", "float4_e2m1fn_x2", "torch tensors"])
    assert_refused(quantize, (x,), {"codes_dtype": "int4"}, ValueError,
                   ["codes_dtype", "'uint8' or 'float4_e2m1fn_x2'", "'int4'"])


def test_first_call_of_a_process_compiled():
    """torch.compile tracing cuquant's very first call (nothing registered yet)."""
    code = ("import torch, cuquant\n"
            "x = torch.randn(4, 256)\n"
            "f = torch.compile(lambda x: cuquant.quantize_int8_per_channel(x), fullgraph=True)\n"
            "a, b = f(x)\n"
            "c, d = cuquant.quantize_int8_per_channel(x)\n"
            "print(torch.equal(a, c) and torch.equal(b, d))\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(cq.__file__)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.stdout.strip() == "True", res.stderr[-2000:]


def test_import_loads_neither_torch_nor_jax():
    code = ("import sys, cuquant\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'jax', 'jaxlib'))))\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(cq.__file__)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert res.stdout.strip() == ""
