"""The tile quantizer (cuda_src/groups/tiles.cuh, quantize_groups_tiles: a warp holds a
tile of 16-byte units in registers, reduces its groups by shuffles and prepares them a lane
each) against the NumPy backend, bit for bit.

The fixture's policy makes sure the kernel is on and each case gets fresh launch plans. Every group-wise and zero-point quantizer variant whose groups are 2 to 32 whole
units runs on its declared shapes with edge rows (zeros, infinities, subnormals, -0, NaN),
and every (format, group size, dtype) on inputs of exactly one tile, one tile and one
group (the last tile moved back over the one before), and several tiles with groups that
need the careful arithmetic among others. Each case checks which kernel ran."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import cuquant as cq
import op_table
from cuquant._core.dtypes import FLOATS
from test_gpu import _compare_edge_rows, built_kernels  # noqa: F401 - a fixture

pytestmark = pytest.mark.gpu

FAMILIES = ("groupwise", "zero_point")
SIZES = {"float16": 2, "bfloat16": 2, "float32": 4}


def _units(variant, dtype):
    """The variant's group size in 16-byte units, or None where it is not whole units."""
    nbytes = variant["group_size"] * SIZES[dtype]
    return nbytes // 16 if nbytes % 16 == 0 else None


def _cases():
    for op in op_table.all_ops():
        if op.kind != "quantize" or op.family not in FAMILIES:
            continue
        for variant, dtype in itertools.product(op.variants, op.dtypes):
            if _units(variant, dtype) in cq.DEFAULT_POLICY.tile_units:
                yield pytest.param(op, variant, dtype, id=f"{op.name}-{op.notes}-{variant}-{dtype}")


@pytest.fixture
def tiles(built_kernels):
    """A policy with the tile kernel on (`policy`), fresh launch plans; kernels() lists the
    tile kernels the plans asked for (name expressions)."""
    from cuquant._cuda import launch

    class Tiles:
        policy = cq.KernelPolicy(tiles=True)

        @staticmethod
        def kernels():
            return [e for e in built_kernels if "quantize_groups_tiles" in e]

        @staticmethod
        def run(call):
            """call() planned afresh: (its result, the kernels its plan asked for)."""
            launch.clear_plans()
            del built_kernels[:]
            return call(), list(built_kernels)

    return Tiles()


@pytest.mark.parametrize("op,variant,dtype", list(_cases()))
def test_tiles_match_numpy(op, variant, dtype, tiles, rng):
    from cuquant._cuda import groups as groupwise

    units = _units(variant, dtype)
    tile = 32 * groupwise.tile_geometry(units)[1]
    filled = False
    for shape in op.shapes:
        size = _compare_edge_rows(op, shape, dtype, variant, rng, f"{op.name} {shape} {variant}",
                                  tiles.policy)
        filled = filled or size * SIZES[dtype] // 16 >= tile
    # The kernel ran where a shape fills a tile, and only then.
    assert bool(tiles.kernels()) == filled, (shape, tiles.kernels())


def _zero_point_calls(x, rng):
    """(what, kwargs) of the zero point's three rounding modes for x; "seed-general" is
    seeded rounding through the general build, which takes tensors above the seeded
    build's 2**34 elements (the policy's seeded_build_max_elements)."""
    rbits = rng.integers(0, 2**32, size=x.shape, dtype=np.uint32)
    seed = {"rounding": "stochastic", "seed": 0x1234_5678_9ABC}
    return [("nearest", {}), ("rbits", {"rounding": "stochastic", "rbits": rbits}),
            ("seed", seed), ("seed-general", seed)]


def _check_formats(tiles, x, bits, g, ft, geom, what, rng):
    """Both DeepSpeed symmetries and, for 16-bit data, the zero point in each rounding mode
    on the host array x, planned afresh on the GPU, against the NumPy backend bit for bit,
    each through the tile kernel of geometry `geom` alone (ft: x's FloatType)."""
    import cupy as cp

    from _util import assert_same_bits
    from cuquant import _numpy
    from cuquant._cuda import groups as groupwise

    xd = cp.asarray(x)
    for sym in (False, True):
        (q, p), built = tiles.run(lambda: cq.quantize_groupwise(xd, bits, sym, g,
                                                                policy=tiles.policy))
        qh, ph = _numpy.quantize_groupwise(x, bits, sym, g)
        assert_same_bits(q, qh, f"{what} sym={sym} codes")
        assert_same_bits(p, ph, f"{what} sym={sym} params")
        assert built == [groupwise.quant_tile_expr(f"cq::DeepSpeed<{bits}>", ft, geom)], \
            (what, sym, built)
    if x.dtype.itemsize != 2:
        return
    for mode, kw in _zero_point_calls(x, rng):
        dkw = {key: cp.asarray(v) if isinstance(v, np.ndarray) else v for key, v in kw.items()}
        policy = tiles.policy
        if mode.startswith("seed"):
            # x is the largest tensor the seeded build takes, or one element too large.
            policy = policy.replace(seeded_build_max_elements=x.size - (mode == "seed-general"))
        got, built = tiles.run(lambda: cq.quantize_groupwise_zero_point(xd, bits, g, **dkw,
                                                                        policy=policy))
        want_out = cq.quantize_groupwise_zero_point(x, bits, g, **kw)
        for i, (a, b) in enumerate(zip(got, want_out)):
            assert_same_bits(a, b, f"{what} zero point {mode} output {i}")
        # Rounding to nearest and seeded rounding have builds of their own.
        fmt = {"nearest": f"cq::ZeroPoint<{bits}, cq::ZP_NEAREST>",
               "rbits": f"cq::ZeroPoint<{bits}>",
               "seed": f"cq::ZeroPoint<{bits}, cq::ZP_PHILOX>",
               "seed-general": f"cq::ZeroPoint<{bits}>"}[mode]
        assert built == [groupwise.quant_tile_expr(fmt, ft, geom)], (what, mode, built)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("bits", [4, 8])
def test_every_tile_geometry(dtype, bits, tiles, rng):
    """Every group size the kernel takes, on one tile, one tile and a group, and seven tiles
    less a group, with edge values in a few groups, and with every group a few ulps wide
    (the zero point's careful arithmetic in every tile, DeepSpeed's float32 lower clamp):
    both DeepSpeed symmetries, and the zero point in each rounding mode (16-bit data),
    against the NumPy backend bit for bit."""
    from cuquant._cuda import groups as groupwise
    from test_groupwise_gpu import DTYPES, _narrow_groups, edge_values

    t, ft = DTYPES[dtype], FLOATS[dtype]
    vec = 16 // SIZES[dtype]
    for units in tiles.policy.tile_units:
        g = units * vec
        upg, k = groupwise.tile_geometry(units)
        tile = 32 * k
        for n_units, narrow in ((tile, False), (tile + units, False), (7 * tile - units, False),
                                (3 * tile + units, True)):
            groups = n_units // units
            x = (_narrow_groups(rng, groups, g, t) if narrow
                 else edge_values(rng, groups * g, t, g).reshape(groups, g))
            what = f"{dtype} bits={bits} g={g} units={n_units} narrow={narrow}"
            _check_formats(tiles, x, bits, g, ft, (upg, k), what, rng)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("bits", [4, 8])
def test_warps_taking_many_tiles(dtype, bits, tiles, rng):
    """One block for the whole input (the policy's tile_max_blocks), so each of its warps takes
    several tiles in turn: DeepSpeed's format loads each next tile while it encodes the one
    before, also across tiles whose groups take the careful arithmetic (which reads its
    units again) and into the last tile, moved back; the zero point, planned a tile a warp,
    walks the same loop here. Against the NumPy backend bit for bit, every group size."""
    from cuquant._cuda import groups as groupwise
    from test_groupwise_gpu import DTYPES, _narrow_groups, edge_values

    tiles.policy = tiles.policy.replace(tile_max_blocks=1)
    t = DTYPES[dtype]
    vec = 16 // SIZES[dtype]
    for units in tiles.policy.tile_units:
        g = units * vec
        tile = 32 * groupwise.tile_geometry(units)[1]
        # 30 tiles for 8 warps (six take four, two take three); the last one is moved back.
        groups = (29 * tile + units) // units
        x = edge_values(rng, groups * g, t, g).reshape(groups, g)
        narrow = rng.choice(groups, size=3, replace=False)   # careful groups in a few tiles
        x[narrow] = _narrow_groups(rng, 3, g, t)
        what = f"{dtype} bits={bits} g={g} groups={groups}"
        _check_formats(tiles, x, bits, g, FLOATS[dtype], groupwise.tile_geometry(units),
                       what, rng)
