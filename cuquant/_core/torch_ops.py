"""Every declared op (`_core.declare.OPS`) as a torch custom op, `torch.ops.cuquant.<name>`,
so that torch.compile puts a call in its graph rather than breaking it: a fake
implementation from the op's declared outputs, and one implementation for CPU and CUDA
tensors alike that calls the public function (the NumPy backend or the kernels).

A custom op takes the call's tensors as a list and its other arguments as a string (a
Python literal: numbers, strings, tuples, dtypes by name, the kernel policy by its fields),
since the public functions take arguments a custom op's schema cannot (dtypes of any
family, the policy). The public functions route to their custom op by themselves while
torch.compile traces them (`_core.replay`); eager calls never pass the dispatcher.
Imported only once torch is in use."""

from __future__ import annotations

import ast
import dataclasses

import torch

from . import declare as _declare

NAMESPACE = "cuquant"
_TENSOR, _DTYPE, _POLICY = "__tensor__", "__dtype__", "__policy__"
_registered: dict = {}  # name -> the custom op
_POLICY_FIELDS: tuple = ()  # the kernel policy's fields, by name


def _encode_value(v):
    if isinstance(v, tuple):
        return tuple(_encode_value(e) for e in v)
    if isinstance(v, list):
        return [_encode_value(e) for e in v]
    if isinstance(v, dict):
        return {k: _encode_value(e) for k, e in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return (_DTYPE, str(v).removeprefix("torch."))
    if dataclasses.is_dataclass(v) and getattr(type(v), "__replay_plain__", False):
        return (_POLICY, tuple((f.name, getattr(v, f.name)) for f in dataclasses.fields(v)))
    try:  # NumPy and ml_dtypes dtypes and scalar types
        import numpy as np

        return (_DTYPE, np.dtype(v).name)
    except TypeError:
        pass
    raise TypeError(f"cuquant: under torch.compile an argument must be a tensor, a number, a "
                    f"string, a dtype or a KernelPolicy; got {type(v).__name__}")


def _encode(args, kwargs) -> str:
    """The arguments (tensors already replaced by their places) as a Python literal."""
    return repr((_encode_value(args), _encode_value(kwargs)))


# Run by the tracer, not traced (torch._dynamo.assume_constant_result): its arguments are
# constants while tracing, and so is the string.
_encode._dynamo_marked_constant = True


def _decode_value(v, tensors, policy_type=None):
    if isinstance(v, tuple):
        if len(v) == 2 and v[0] == _TENSOR:
            return tensors[v[1]]
        if len(v) == 2 and v[0] == _DTYPE:
            return v[1]
        if len(v) == 2 and v[0] == _POLICY:
            return policy_type(**dict(v[1]))
        return tuple(_decode_value(e, tensors, policy_type) for e in v)
    if isinstance(v, list):
        return [_decode_value(e, tensors, policy_type) for e in v]
    if isinstance(v, dict):
        return {k: _decode_value(e, tensors, policy_type) for k, e in v.items()}
    return v


def decode(spec: str, tensors, fn):
    """The arguments of a call of `fn` from its tensors and its string."""
    policy = fn.__cuquant_signature__.parameters.get("policy")
    policy_type = type(policy.default) if policy is not None else None
    args, kwargs = ast.literal_eval(spec)
    return (_decode_value(args, tensors, policy_type),
            _decode_value(kwargs, tensors, policy_type))


def _split(v, tensors):
    """v with every tensor replaced by its place in `tensors` (appended)."""
    if isinstance(v, torch.Tensor):
        tensors.append(v)
        return (_TENSOR, len(tensors) - 1)
    if isinstance(v, (tuple, list)):
        return tuple(_split(e, tensors) for e in v)
    if isinstance(v, dict):
        return {k: _split(e, tensors) for k, e in v.items()}
    return v


def route(call, args, kwargs):
    """Call `call`'s custom op (what a traced call does)."""
    if kwargs.get("stream") is not None:
        raise TypeError(f"{call.__name__}: stream= is not taken under torch.compile; the call "
                        "runs on torch's current stream")
    kwargs = {k: v for k, v in kwargs.items() if k != "stream"}
    policy = kwargs.get("policy")
    if policy is not None:  # by its fields: the tracer reads them as constants
        kwargs["policy"] = (_POLICY, tuple([(n, getattr(policy, n)) for n in _POLICY_FIELDS]))
    tensors: list = []
    spec = _encode(_split(tuple(args), tensors), _split(kwargs, tensors))
    outs = getattr(getattr(torch.ops, NAMESPACE), call.__name__)(tensors, spec)
    if call.__cuquant_many__:
        return list(outs)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _results(fn, tensors, spec):
    args, kwargs = decode(spec, tensors, fn)
    res = fn(*args, **kwargs)
    res = list(res) if isinstance(res, (tuple, list)) else [res]
    # A custom op's outputs may not alias its inputs (a static scale comes back as given).
    inputs = {t.data_ptr() for t in tensors if t.numel()}
    return [r.clone() if r.numel() and r.data_ptr() in inputs else r for r in res]


def _fake(fn, tensors, spec):
    args, kwargs = decode(spec, tensors, fn)
    device = tensors[0].device if tensors else torch.device("cpu")
    outs = []
    for o in _declare.outputs_of(fn, args, kwargs):
        dt = getattr(torch, o.dtype)
        if o.column:
            m, g = o.shape
            outs.append(torch.empty((g, -(-m // 4) * 4), dtype=dt, device=device)[:, :m].T)
        else:
            outs.append(torch.empty(o.shape, dtype=dt, device=device))
    return outs


def _register_one(name, fn):
    def impl(tensors: list[torch.Tensor], spec: str) -> list[torch.Tensor]:
        return _results(fn, tensors, spec)

    impl.__name__ = name
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=())
    op.register_fake(lambda tensors, spec: _fake(fn, tensors, spec))
    return op


def register():
    """Register every declared op (once); returns `route`."""
    global _POLICY_FIELDS
    for name, fn in _declare.OPS.items():
        policy = fn.__cuquant_signature__.parameters.get("policy")
        if policy is not None and not _POLICY_FIELDS:
            _POLICY_FIELDS = tuple(f.name for f in dataclasses.fields(policy.default))
        if name not in _registered:
            _registered[name] = _register_one(name, fn)
    return route


def ops() -> dict:
    """The custom ops by name (registered on first need)."""
    register()
    return dict(_registered)


__all__ = ["register", "route", "ops", "decode", "NAMESPACE"]
