"""The staged group quantizer (a producer warp fills shared-memory stages with bulk copies,
consumer warps quantize; cuda_src/groups/staged.cuh and ring.cuh) against the NumPy
backend, bit for bit.

Every group-wise quantizer runs with each variant whose groups fit a stage, with edge rows
(zeros, infinities, subnormals, -0, NaN), under the default stages, under 2 KB stages that
make every block wrap its ring many times and make chunks of a single group, and with two
units a thread; and every geometry the DeepSpeed format's plan can pick, from groups of one
16-byte unit to groups that fill a stage. The size threshold is lifted so that small
inputs take the staged kernel too, and each case checks which kernel ran."""

from __future__ import annotations

import numpy as np
import pytest

import op_table
from cuquant._core.dtypes import FLOATS
import cuquant as cq
from test_gpu import _compare_edge_rows, built_kernels  # noqa: F401 - a fixture

pytestmark = pytest.mark.gpu

CONFIGS = {"default-stages": {}, "2KB-stages": {"stage_bytes": 2048},
           "two-units": {"staged_hold": 2, "staged_hold_large": 2, "staged_two_pass": False,
                         "stage_bytes": 4096},
           "one-pass": {"staged_two_pass": False, "staged_hold_large": 4}}
STAGED_FAMILIES = ("groupwise", "zero_point")


def _fits(op, variant, dtype, config) -> bool:
    """Whether the case's groups are whole 16-byte units that fit one stage."""
    g = variant["group_size"]
    size = {"float16": 2, "bfloat16": 2, "float32": 4}[dtype]
    stage = CONFIGS[config].get("stage_bytes", cq.DEFAULT_POLICY.stage_bytes)
    return (g * size) % 16 == 0 and g * size <= stage


def _staged_cases():
    for op in op_table.all_ops():
        if op.kind != "quantize" or op.family not in STAGED_FAMILIES:
            continue
        for variant in op.variants:
            for dtype in op.dtypes:
                for config in CONFIGS:
                    if _fits(op, variant, dtype, config):
                        yield pytest.param(op, variant, dtype, config,
                                           id=f"{op.name}-{op.notes}-{variant}-{dtype}-{config}")


@pytest.fixture
def staged(built_kernels):
    """A policy (`policy`) with the staged kernel for every input size on any device and
    the tile kernel off (it would take these groups first), fresh launch plans;
    configure(name) picks the stage geometry, kernels() lists the staged kernels the plans
    asked for."""

    class Staged:
        policy = cq.KernelPolicy(staged_min_bytes=0, tiles=False, staged=True)

        def configure(self, name):
            self.policy = self.policy.replace(**CONFIGS[name])

        @staticmethod
        def kernels():
            """The staged kernels the plans asked for (name expressions)."""
            return [e for e in built_kernels if "staged" in e]

    return Staged()


@pytest.mark.parametrize("op,variant,dtype,config", list(_staged_cases()))
def test_staged_matches_numpy(op, variant, dtype, config, staged, rng):
    staged.configure(config)
    for shape in op.shapes:
        _compare_edge_rows(op, shape, dtype, variant, rng, f"{op.name} {shape} {variant}",
                           staged.policy)
    assert staged.kernels(), f"{op.name} {variant} never took the staged kernel"
    units = variant["group_size"] * {"float32": 4}.get(dtype, 2) // 16
    # The DeepSpeed format for every divisor of 32 units; the zero point by rounding:
    # nearest and the caller's words from 2 to 32 units, seeded words at 4.
    if op.family == "groupwise":
        sizes = (1, 2, 4, 8, 16, 32)
    else:
        sizes = (4,) if variant.get("source") == "seed" else (2, 4, 8, 16, 32)
    two_pass = units in sizes and CONFIGS[config].get("staged_two_pass", True)
    assert {e.endswith(", 0>") for e in staged.kernels()} == {not two_pass}, \
        (config, staged.kernels())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("bits", [4, 8])
def test_every_staged_geometry(dtype, bits, staged, rng):
    """Each geometry the plan picks for the DeepSpeed format, groups of 1 to 2048 16-byte
    units: the two-pass kernel up to 32 units, one pass above (8 units a thread for 16-bit
    data, 4 for float32), three stages' worth of groups with edge values each, both
    symmetries, against the NumPy backend bit for bit."""
    from _util import assert_same_bits
    from cuquant import _numpy
    from cuquant._cuda import groups as groupwise
    from test_groupwise_gpu import DTYPES, dev, edge_values

    t = DTYPES[dtype]
    size = np.dtype(t).itemsize
    vec = 16 // size
    fmt = f"cq::DeepSpeed<{bits}>"
    for units in (1 << i for i in range(12)):
        g = units * vec
        groups = 3 * (staged.policy.stage_bytes // (g * size))
        x = edge_values(rng, groups * g, t, g).reshape(groups, g)
        for sym in (False, True):
            what = f"{dtype} bits={bits} sym={sym} g={g}"
            q, p = cq.quantize_groupwise(dev(x), bits, sym, g, policy=staged.policy)
            qh, ph = _numpy.quantize_groupwise(x, bits, sym, g)
            assert_same_bits(q, qh, what + " codes")
            assert_same_bits(p, ph, what + " params")
        geom = (groupwise.two_pass_geometry(units) if units <= 32
                else groupwise.staged_geometry(units, 8 if size == 2 else 4))
        assert groupwise.staged_choice(units, FLOATS[dtype]) == geom
        want = groupwise.quant_staged_expr(fmt, FLOATS[dtype], geom)
        assert staged.kernels()[-1] == want, (units, staged.kernels()[-2:])
