"""The plan: what each input tensor becomes, and which output shard it lands in."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from .engines import EngineFormat
from .formats import FLOAT_DTYPES, Format
from .report import TensorRecord
from .safetensors import TensorInfo, TensorSpec


@dataclass
class _Item:
    record: TensorRecord
    src: TensorInfo
    outputs: list[TensorSpec]
    fmt: Format | None = None
    group: int = 0
    companion: TensorInfo | None = None  # dequantize: the scale / params read beside
    out_dtype: str | None = None  # dequantize: the float type restored
    rows: tuple[int, int] | None = None  # one band of rows only (a cluster's task)

    @property
    def out_bytes(self) -> int:
        return sum(s.size() for s in self.outputs)


def _matches(name: str, patterns: Sequence[str]) -> str | None:
    for p in patterns:
        if fnmatch.fnmatchcase(name, p):
            return p
    return None


def _decide(info: TensorInfo, fmt, skip: Sequence[str], group: int) -> str | None:
    """Why tensor `info` stays in high precision, or None to quantize it."""
    if info.dtype not in FLOAT_DTYPES:
        return f"dtype {info.dtype}"
    if len(info.shape) != 2:
        return f"{len(info.shape)}-D"
    if not (info.name == "weight" or info.name.endswith(".weight")):
        return "not a .weight"
    n, k = info.shape
    if n == 0 or k == 0:
        return "empty"
    hit = _matches(info.name, skip)
    if hit:
        return f"matches {hit!r}"
    if isinstance(fmt, EngineFormat):
        return fmt.unfit(n, k, info.dtype, group)
    return fmt.unfit(n, k, group)


def _shard(items: list[_Item], max_bytes: int) -> list[list[_Item]]:
    """Greedy packing in input order; an item's tensors never split across shards."""
    shards: list[list[_Item]] = [[]]
    size = 0
    for it in items:
        b = it.out_bytes
        if shards[-1] and size + b > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += b
    return shards if shards[0] else []


def _shard_names(count: int) -> list[str]:
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
