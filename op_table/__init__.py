"""The op table that the GPU tests and the benchmark enumerate: one declaration per public op
(its dtypes, the variants and shapes to test and to benchmark, how to make realistic inputs,
the bytes it moves, and the baselines to compare against), so that a new op cannot skip
either. It lives beside the package, not in it: the repository's tests and benchmark import
it from the checkout's root, and no wheel carries it. It needs the test and benchmark
dependencies only for what it runs (torch for the baselines).

Inputs are made with an array module `xp` (NumPy or CuPy) so that benchmarks generate
large inputs on the device."""

from __future__ import annotations

from . import groups, microscaling, symmetric
from .ops import (BENCH_SHAPES, F, H, HEADLINE, SMALL_SHAPES, TEST_SHAPES_2D, Op,
                  float_input)

OPS: list[Op] = symmetric.OPS + groups.OPS + microscaling.OPS


def all_ops() -> list[Op]:
    """Every declaration (the table itself: `OPS`)."""
    return OPS


def declared_names() -> set[str]:
    return {op.name for op in OPS}


__all__ = ["Op", "OPS", "all_ops", "declared_names", "float_input", "BENCH_SHAPES",
           "SMALL_SHAPES", "HEADLINE", "TEST_SHAPES_2D", "F", "H"]
