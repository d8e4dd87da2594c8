"""Which kernel a call takes: the choices the launch plans make between kernels of one
family, as one immutable value.

Every public op takes ``policy=`` (keyword-only, `DEFAULT_POLICY` when not given). A policy
changes which kernel runs and with what geometry, never the bits of a result: every kernel a
policy can pick computes the same codes and scales. Tests pass their own policy to reach a
kernel at sizes where the default would take another one, and benchmarks to compare the
kernels of a family; the plan tables and the replays of repeated calls are keyed by it, so
calls under different policies never share a plan.

The default values are the choice measured best on the GPUs the kernels are tuned for; the
reasons are at each field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

_KEYS: dict = {}  # the fields of each distinct policy made -> its key


@dataclass(frozen=True)
class KernelPolicy:
    """The choices between kernels of a family, and the geometry they take.

    Parameters
    ----------
    smooth_rows_min_elements : int
        SmoothQuant problems of at least this many elements take smooth_quant_rows, which
        keeps the factors and their reciprocals in shared memory; smaller ones take the
        general row kernel (each block of smooth_quant_rows first builds its tables, which
        small calls do not earn back).
    smooth_wide_min_elements : int
        From this many elements on, smooth_quant_rows gives rows of more than 128 vectors
        teams of up to 7 vectors a thread (fewer threads, more rows at once); below, teams
        of up to 4 vectors, which finish a row sooner when there are few rows a team.
    tiles : bool
        Group-wise quantizers whose groups are `tile_units` whole 16-byte units take the
        tile kernel (a warp's tile of units held in registers) ahead of the staged one.
    tile_units : tuple of int
        The group sizes, in 16-byte units, that the tile kernel takes (divisors of 32).
    tile_units_per_lane : int
        Units a lane of the tile kernel holds: 8 keep enough bytes in flight a warp; 16
        would spill seeded rounding's registers.
    tile_max_blocks : int or None
        A cap on the tile kernel's grid (None: none), so that each warp takes many tiles
        even on small inputs.
    staged : bool or None
        The staged quantizer (a producer warp filling a ring of shared-memory stages with
        bulk copies) is taken where the device has bulk copies (None, sm_90 and up), on
        every device (True; for tests of the plan on any machine), or never (False).
    staged_min_bytes : int
        Inputs of at least this many bytes take the staged quantizer.
    stage_bytes : int
        Bytes of one stage; `staged_smem_per_block` bytes of stages a block. Two 32 KB
        stages a block let three blocks share a multiprocessor: one stage in flight while
        the consumers work on the other, and three blocks' consumer warps to cover each
        other's arithmetic. Other sizes favour one width or build and lose on another.
    staged_smem_per_block : int
    staged_hold, staged_hold_large, staged_large_units : int
        Units of a group a staged consumer thread holds: `staged_hold_large` for groups of
        `staged_large_units` units and more of 16-bit data, `staged_hold` otherwise (a
        format may set its own).
    staged_two_pass : bool
        Groups of a size that divides 32 units take the staged kernel that reduces a warp's
        groups first and writes their codes in a second pass over the stage.
    small : bool
        Small groups off the fast path take quantize_groups_small (a block of 256 groups
        through shared memory, a thread a group) where a block's groups fit `small_smem`
        bytes; otherwise the general kernel.
    small_smem : int
    spanning : bool
        Dequantizers of groups that are not whole 16-byte units of output keep 16-byte
        units that span groups where codes and parameters are aligned; otherwise the
        general path, an element at a time.
    seeded_build_max_elements : int
        The zero-point quantizer's build for seeded stochastic rounding alone (its tile
        kernel) takes every Philox counter's high word as 0: it serves tensors of at most
        this many elements, larger ones take the general build.
    """

    smooth_rows_min_elements: int = 1 << 23
    smooth_wide_min_elements: int = 1 << 25
    tiles: bool = True
    tile_units: tuple = (2, 4, 8, 16, 32)
    tile_units_per_lane: int = 8
    tile_max_blocks: int | None = None
    staged: bool | None = None
    staged_min_bytes: int = 1 << 20
    stage_bytes: int = 32 * 1024
    staged_smem_per_block: int = 64 * 1024
    staged_hold: int = 4
    staged_hold_large: int = 8
    staged_large_units: int = 64
    staged_two_pass: bool = True
    small: bool = True
    small_smem: int = 48 * 1024
    spanning: bool = True
    seeded_build_max_elements: int = 1 << 34

    # A policy is part of the keys of replays (see cuquant._core.replay): a value compared by
    # its fields. Plan keys hold its `key` instead, an int that equal policies share, whose
    # hash costs nothing on the path of every call.
    __replay_plain__ = True

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
        fields = dataclasses.astuple(self)
        object.__setattr__(self, "key", _KEYS.setdefault(fields, len(_KEYS)))

    def __hash__(self):
        return hash(self.key)

    def replace(self, **changes) -> "KernelPolicy":
        """A copy with `changes` to its fields."""
        return dataclasses.replace(self, **changes)


DEFAULT_POLICY = KernelPolicy()


def check_policy(policy, op: str) -> KernelPolicy:
    """The policy= argument of a public op, refused unless a KernelPolicy."""
    if type(policy) is not KernelPolicy:
        raise TypeError(f"{op}: policy must be a cuquant.KernelPolicy; got "
                        f"{type(policy).__name__}")
    return policy


__all__ = ["KernelPolicy", "DEFAULT_POLICY", "check_policy"]
