"""The entry of the op table (`Op`), the shapes it uses and the inputs it makes: weights-like
arrays made with an array module `xp` (NumPy or CuPy), so that benchmarks generate large
inputs on the device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import cuquant
from cuquant._core.dtypes import FLOATS

BENCH_SHAPES = ((1, 4096), (16, 4096), (128, 7168), (4096, 7168), (16384, 7168))
SMALL_SHAPES = ((1, 4096), (16, 4096), (128, 7168))
HEADLINE = (16384, 7168)

TEST_SHAPES_2D = ((1, 1), (3, 5), (7, 128), (37, 999), (64, 7168), (130, 257), (256, 4096),
                  (5, 16400), (2, 70000))


@dataclass(frozen=True)
class Op:
    name: str
    family: str
    kind: str                        # "quantize" or "dequantize"
    dtypes: tuple                    # input dtypes (quantizers) / output dtypes (dequantizers)
    make: Callable                   # make(xp, rng, shape, dtype, **variant) -> (args, kwargs)
    variants: tuple = ({},)
    shapes: tuple = TEST_SHAPES_2D
    bench_shapes: tuple = BENCH_SHAPES
    bench_variants: tuple = ({},)
    target: float = 0.92             # fraction of copy bandwidth at HEADLINE (formats.md section 8)
    moved: Callable | None = None    # bytes really moved, where it differs from in + out
    torch_ref: Callable | None = None
    cupy_ref: Callable | None = None
    notes: str = ""
    fp8_outputs: tuple = field(default=())
    bench_dtype: str | None = None   # the benchmark's input dtype (default bfloat16)
    # The same work done another way (alternative(args, kwargs) -> a callable), timed
    # beside the op by the benchmark, e.g. a batched call against one call per tensor.
    alternative: Callable | None = None
    alternative_name: str = ""

    @property
    def fn(self):
        return getattr(cuquant, self.name)


# ---------------------------------------------------------------------------------------
# Inputs

def float_input(xp, rng, shape, dtype, *, scale_rows=True):
    """Weights-like data: normal, rows at different scales, a few outliers. `rng` is a
    NumPy Generator (its seed drives CuPy's generator too)."""
    seed = int(rng.integers(1 << 31))
    g = xp.random.default_rng(seed)
    x = g.standard_normal(size=shape, dtype=np.float32)
    if scale_rows and len(shape) >= 2 and x.size:
        rows = g.uniform(-3.0, 1.0, size=shape[:-1] + (1,)).astype(np.float32)
        x = x * (10.0 ** rows)
        flat = x.reshape(-1)
        k = max(1, flat.size // 997)
        idx = g.integers(0, flat.size, size=k)
        flat[idx] = flat[idx] * 40.0
    return x.astype(FLOATS[np.dtype(dtype).name if not isinstance(dtype, str) else dtype].numpy)


F = ("float16", "bfloat16", "float32")
H = ("float16", "bfloat16")

__all__ = ["Op", "float_input", "BENCH_SHAPES", "SMALL_SHAPES", "HEADLINE", "TEST_SHAPES_2D",
           "F", "H"]
