"""The command's console output: a progress bar, tables and the run's summary."""

from __future__ import annotations

import math
import os
import sys
import time


class ProgressBar:
    """A one-line progress bar on stderr: tensors and bytes done, throughput, ETA.

    On a terminal the line redraws in place ten times a second at most; elsewhere (a log
    file, with --progress) a plain line is printed every few seconds.
    """

    def __init__(self, label: str, stream=None, tty: bool | None = None):
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.t0 = time.perf_counter()
        self.last = -1.0
        self.drawn = False

    def __call__(self, done_t: int, total_t: int, done_b: int, total_b: int, name: str) -> None:
        from ..checkpoint import human_bytes

        now = time.perf_counter()
        final = done_t == total_t and done_b >= total_b
        if not final and now - self.last < (0.1 if self.tty else 5.0):
            return
        self.last = now
        elapsed = max(now - self.t0, 1e-9)
        rate = done_b / elapsed
        eta = (total_b - done_b) / rate if rate > 0 else float("inf")
        frac = done_b / total_b if total_b else 1.0
        width = 24
        fill = int(frac * width)
        bar = "#" * fill + "-" * (width - fill)
        line = (f"{self.label} [{bar}] {frac * 100:5.1f}%  {done_t}/{total_t} tensors  "
                f"{human_bytes(done_b)}/{human_bytes(total_b)}  {human_bytes(rate)}/s  "
                f"ETA {_clock(eta)}")
        if self.tty:
            cols = _columns()
            tail = f"  {name}"
            text = (line + tail)[: cols - 1]
            self.stream.write("\r" + text.ljust(cols - 1))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.drawn = True

    def note(self, text: str) -> None:
        """A line of its own above the bar (the cluster's workers and dashboard)."""
        if self.tty and self.drawn:
            self.stream.write("\r" + " " * (_columns() - 1) + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()
        self.last = -1.0

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


class Notes:
    """No progress bar, but the run's notes on stderr."""

    def __call__(self, *progress) -> None:
        pass

    def note(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return 100


def _clock(seconds: float) -> str:
    if math.isnan(seconds) or math.isinf(seconds):
        return "--:--"
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A plain text table; `align` holds one "l" or "r" per column."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)
    out = []
    for r in cells:
        out.append("  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                             for c, w, a in zip(r, widths, align)).rstrip())
    return "\n".join(out)


def _db(x) -> str:
    if x is None:
        return "-"
    if x == float("inf"):
        return "exact"
    return f"{x:.2f}"


def _err(x) -> str:
    return "-" if x is None else f"{x:.3e}"


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def summary(report) -> str:
    """The closing summary of a quantize or dequantize run."""
    from ..checkpoint import human_bytes

    rows = []
    for g in report.groups():
        rows.append([g["group"], g["tensors"], human_bytes(g["bytes_in"]),
                     human_bytes(g["bytes_out"]), _db(g["sqnr_db"]), _db(g["worst_sqnr_db"]),
                     _err(g["max_abs_err"])])
    ratio = report.bytes_out / report.bytes_in if report.bytes_in else 1.0
    rows.append(["total", len(report.records), human_bytes(report.bytes_in),
                 human_bytes(report.bytes_out), f"({ratio:.2f}x)", "", ""])
    headers = ["", "tensors", "size before", "size after", "SQNR dB", "worst dB", "max |err|"]
    if report.command == "dequantize" or not report.stats:
        headers, rows = headers[:5], [r[:4] + ([r[4]] if r[0] == "total" else [""]) for r in rows]
        headers[4] = ""
    if report.command == "quantize":
        head = (f"quantized {_n(report.count('quantized'), 'tensor')} to {report.format}, kept "
                f"{report.count('kept')} in high precision")
    else:
        head = (f"dequantized {_n(report.count('dequantized'), 'tensor')}"
                f"{' (' + report.format + ')' if report.format else ''}, copied "
                f"{report.count('kept')} unchanged")
    rate = report.bytes_in / report.seconds if report.seconds > 0 else 0.0
    extra = f" + {_n(len(report.files_copied), 'other file')}" if report.files_copied else ""
    tail = (f"wrote {report.output}: {_n(len(report.shards), 'shard')} and an index{extra}, on "
            f"{report.device}, in {report.seconds:.1f} s ({human_bytes(rate)}/s)")
    return "\n".join([head, table(headers, rows), tail])
