"""The outputs of every public op, declared beside it: the shapes and dtypes a call returns,
worked out from its arguments' shapes and dtypes alone. The torch custom ops
(`_core.torch_ops`) take their list of ops and their fake implementations from here; the
op table's tests check each declaration against the results of real calls."""

from __future__ import annotations

import inspect

from .dtypes import float_type_named

OPS: dict = {}  # name -> the public function, in the order the op modules declare them


class Out:
    """One output: its shape, its dtype's name, and whether it is stored column-major (a
    [shape[1], round_up(shape[0], 4)] buffer seen transposed, see quantize_fp8_per_token_group)."""

    __slots__ = ("shape", "dtype", "column")

    def __init__(self, shape, dtype: str, column: bool = False):
        self.shape, self.dtype, self.column = tuple(int(d) for d in shape), dtype, column

    def __repr__(self):
        return f"Out({self.shape}, {self.dtype!r}{', column' if self.column else ''})"


def declare(outputs, *, many: bool = False):
    """Declare a public op with `outputs(args) -> [Out, ...]`, args its bound arguments
    (defaults applied) by name; `many`: the op returns a list (one output an item)."""

    def wrap(fn):
        fn.__cuquant_outputs__ = outputs
        fn.__cuquant_many__ = many
        fn.__cuquant_signature__ = inspect.signature(fn)
        OPS[fn.__name__] = fn
        return fn
    return wrap


def outputs_of(fn, args, kwargs) -> list:
    """The declared outputs of the call fn(*args, **kwargs) (arrays need .shape, .dtype)."""
    bound = fn.__cuquant_signature__.bind(*args, **kwargs)
    bound.apply_defaults()
    return fn.__cuquant_outputs__(bound.arguments)


def dtype_name(dtype) -> str:
    """The name of an array's dtype in any family (torch.bfloat16 -> 'bfloat16')."""
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    return str(dtype).removeprefix("torch.")


def float_named(dtype, like=None) -> str:
    """A dtype argument's float type name."""
    return float_type_named(dtype, "cuquant", "dtype").name


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["OPS", "Out", "declare", "outputs_of", "dtype_name", "float_named", "cdiv"]
