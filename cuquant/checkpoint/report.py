"""What a run did to each tensor, and the summary of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field


@dataclass
class TensorRecord:
    """What became of one input tensor."""

    name: str
    action: str  # "quantized", "kept" or "dequantized"
    reason: str
    dtype: str
    shape: tuple
    bytes_in: int
    bytes_out: int = 0
    format: str | None = None
    outputs: list[str] = field(default_factory=list)
    signal: float = 0.0  # sum of w^2, for the SQNR
    noise: float = 0.0  # sum of (dequantized - w)^2
    max_abs_err: float | None = None

    @property
    def sqnr_db(self) -> float | None:
        return _sqnr(self.signal, self.noise)

    def to_json(self) -> dict:
        d = {"name": self.name, "action": self.action, "reason": self.reason,
             "dtype": self.dtype, "shape": list(self.shape), "bytes_in": self.bytes_in,
             "bytes_out": self.bytes_out, "format": self.format, "outputs": self.outputs}
        if self.action == "quantized" and self.max_abs_err is not None:
            d["sqnr_db"] = _finite_or_none(self.sqnr_db)
            d["max_abs_err"] = _finite_or_none(self.max_abs_err)
        return d


def _sqnr(signal: float, noise: float) -> float | None:
    """10 log10(signal / noise); inf for an exact result; None when undefined."""
    if not (math.isfinite(signal) and math.isfinite(noise)) or signal <= 0:
        return None
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def _worse(a: float | None, b: float) -> float:
    """The larger error; a NaN (from NaN weights) sticks."""
    if a is None:
        return b
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


def _finite_or_none(x):
    return x if x is not None and math.isfinite(x) else None


@dataclass
class Report:
    """The outcome of one command: every tensor's record plus totals.

    `groups()` sums the records by what they became (each format, or "high precision");
    `to_json()` is what ``--report`` writes.
    """

    command: str
    source: str
    output: str
    format: str | None
    device: str
    options: dict
    records: list[TensorRecord] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    files_copied: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stats: bool = True

    @property
    def bytes_in(self) -> int:
        return sum(r.bytes_in for r in self.records)

    @property
    def bytes_out(self) -> int:
        return sum(r.bytes_out for r in self.records)

    def count(self, action: str) -> int:
        return sum(r.action == action for r in self.records)

    def groups(self) -> list[dict]:
        """Rows by what each tensor became, in a stable order."""
        out: dict[str, dict] = {}
        for r in self.records:
            key = r.format if r.action in ("quantized", "dequantized") else "high precision"
            g = out.setdefault(key, {"group": key, "tensors": 0, "bytes_in": 0, "bytes_out": 0,
                                     "signal": 0.0, "noise": 0.0, "max_abs_err": None,
                                     "worst_sqnr_db": None, "errors": False})
            g["tensors"] += 1
            g["bytes_in"] += r.bytes_in
            g["bytes_out"] += r.bytes_out
            if r.action == "quantized" and r.max_abs_err is not None:
                g["errors"] = True
                g["signal"] += r.signal
                g["noise"] += r.noise
                g["max_abs_err"] = _worse(g["max_abs_err"], r.max_abs_err)
                s = r.sqnr_db
                if s is not None and (g["worst_sqnr_db"] is None or s < g["worst_sqnr_db"]):
                    g["worst_sqnr_db"] = s
        rows = []
        for g in out.values():
            g["sqnr_db"] = _sqnr(g.pop("signal"), g.pop("noise")) if g["errors"] else None
            del g["errors"]
            rows.append(g)
        rows.sort(key=lambda g: (g["group"] == "high precision", g["group"]))
        return rows

    def to_json(self) -> dict:
        import cuquant

        groups = []
        for g in self.groups():
            g = dict(g)
            for k in ("sqnr_db", "worst_sqnr_db", "max_abs_err"):
                g[k] = _finite_or_none(g[k])
            groups.append(g)
        return {
            "cuquant_version": cuquant.__version__, "command": self.command,
            "source": self.source, "output": self.output, "format": self.format,
            "device": self.device, "options": self.options, "seconds": round(self.seconds, 3),
            "summary": {"tensors": len(self.records), "quantized": self.count("quantized"),
                        "dequantized": self.count("dequantized"), "kept": self.count("kept"),
                        "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                        "shards": self.shards, "files_copied": self.files_copied},
            "groups": groups, "warnings": self.warnings,
            "tensors": [r.to_json() for r in self.records],
        }
