"""``cuquant demo``: a synthetic model, quantized in every format, compared.

The model is built locally (no download): a Llama-shaped decoder in bfloat16 whose weights
look like trained ones where it matters for quantization: every output row has its own
scale (log-normal spread), a few input channels carry outlier magnitudes, and a sprinkling
of single weights are far out in the tails. Each format then quantizes it; the table and
the chart compare size against error.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ..checkpoint.safetensors import SafetensorsWriter, TensorSpec

__all__ = ["ModelShape", "build_model", "model_shape", "plot_results", "run_demo"]

_HIDDEN = (128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096)


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Names and shapes, Hugging Face Llama naming."""
        h, i, kv = self.hidden, self.intermediate, self.kv_heads * self.head_dim
        out = [("model.embed_tokens.weight", (self.vocab, h))]
        for n in range(self.layers):
            p = f"model.layers.{n}."
            out += [(p + "input_layernorm.weight", (h,)),
                    (p + "self_attn.q_proj.weight", (h, h)),
                    (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h)),
                    (p + "self_attn.o_proj.weight", (h, h)),
                    (p + "post_attention_layernorm.weight", (h,)),
                    (p + "mlp.gate_proj.weight", (i, h)),
                    (p + "mlp.up_proj.weight", (i, h)),
                    (p + "mlp.down_proj.weight", (h, i))]
        out += [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab, h))]
        return out

    def nbytes(self) -> int:
        return 2 * sum(math.prod(s) for _, s in self.tensors())

    def config(self) -> dict:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "vocab_size": self.vocab, "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
                "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


MIN_LAYERS = 6  # so the layers, not the embeddings, make up most of the model


def model_shape(size_bytes: int) -> ModelShape:
    """The widest model of the ladder that holds `MIN_LAYERS` layers in `size_bytes`
    (bf16), with as many layers as fit (at least one)."""
    def make(h, layers):
        inter = max(128, round(h * 8 / 3 / 128) * 128)
        heads = max(1, h // 64)
        return ModelShape(h, inter, layers, heads, max(1, heads // 4), 8 * h)

    h = _HIDDEN[0]
    for cand in _HIDDEN:
        if make(cand, MIN_LAYERS).nbytes() <= size_bytes:
            h = cand
    bare = make(h, 0).nbytes()
    one = make(h, 1).nbytes() - bare
    return make(h, max(1, (size_bytes - bare) // one))


def _weights(rng: np.random.Generator, name: str, shape: tuple[int, ...], rows: slice,
             col_gain: np.ndarray | None) -> np.ndarray:
    """Rows `rows` of one synthetic tensor, float32."""
    if len(shape) == 1:  # norms: near one
        return (1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    n = rows.stop - rows.start
    k = shape[1]
    std = 0.02 if "embed" in name or "lm_head" in name else (
        0.012 if ("o_proj" in name or "down_proj" in name) else 0.02)
    w = rng.standard_normal((n, k), dtype=np.float32)
    w *= (std * rng.lognormal(0.0, 0.4, size=(n, 1))).astype(np.float32)  # per-row scale
    if col_gain is not None:
        w *= col_gain  # outlier input channels
    tails = rng.random((n, k), dtype=np.float32) < 2e-4  # rare large single weights
    w[tails] *= rng.uniform(6.0, 20.0, size=int(tails.sum())).astype(np.float32)
    return w


def build_model(path, size_bytes: int, seed: int = 0) -> ModelShape:
    """Write a synthetic checkpoint (two shards, an index, config and a tokenizer
    stand-in) to directory `path`, streaming, one band of rows at a time."""
    shape = model_shape(size_bytes)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = shape.tensors()
    half = len(tensors) // 2
    shards = [tensors[:half], tensors[half:]]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map, total = {}, 0
    for part, fname in zip(shards, names):
        specs = [TensorSpec(n, "BF16", s) for n, s in part]
        with SafetensorsWriter(path / fname, specs, {"format": "pt"}) as w:
            for n, s in part:
                gain = None
                if len(s) == 2:
                    gain = np.ones(s[1], dtype=np.float32)
                    hot = rng.random(s[1]) < 0.01
                    gain[hot] = rng.uniform(4.0, 12.0, size=int(hot.sum()))
                step = max(1, (1 << 21) // (s[1] if len(s) == 2 else 1))
                for r0 in range(0, s[0], step):
                    r1 = min(s[0], r0 + step)
                    block = _weights(rng, n, s, slice(r0, r1), gain)
                    w.write(n, block.astype(ml_dtypes.bfloat16))
                    if len(s) == 1:
                        break
                weight_map[n] = fname
                total += 2 * math.prod(s)
    with open(path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(path / "config.json", "w") as f:
        json.dump(shape.config(), f, indent=2)
    with open(path / "generation_config.json", "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f, indent=2)
    return shape


def _points_and_labels(ax, pts: list[tuple]) -> None:
    """Scatter (x, y, label) points; formats that land on one point share a label, and
    labels of one column of points are spread apart so that none overlaps."""
    merged: dict[tuple, list] = {}
    for x, y, text in pts:
        merged.setdefault((round(x, 2), float(f"{y:.3g}")), []).append((x, y, text))
    points = [(g[0][0], g[0][1], " / ".join(t for _, _, t in g)) for g in merged.values()]
    for x, y, _ in points:
        ax.scatter([x], [y], s=60)
    ax.figure.canvas.draw()  # fixes the limits, so that data maps to display coordinates
    to_px = ax.transData.transform
    gap = 12 * ax.figure.dpi / 72   # one label line, in pixels
    columns: dict[int, list] = {}
    for x, y, text in points:
        columns.setdefault(round(x), []).append((to_px((x, y))[1], x, y, text))
    for col in columns.values():
        col.sort()
        placed = []
        for py, x, y, text in col:   # from the bottom up, each label at least a line above
            want = py - 4
            if placed and want < placed[-1] + gap:
                want = placed[-1] + gap
            placed.append(want)
            ax.annotate(text, (x, y), textcoords="offset points",
                        xytext=(7, (want - py) * 72 / ax.figure.dpi))


def plot_results(rows: list[dict], path, title: str) -> None:
    """Two panels: SQNR and max abs error against bits per weight, one point per format.
    Needs matplotlib (the ``plot`` extra)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.set(xlabel="bits per quantized weight (codes + scales)", ylabel="SQNR (dB), higher is better",
            title="signal to quantization noise")
    ax2.set(xlabel="bits per quantized weight (codes + scales)", ylabel="max |error|",
            yscale="log", title="worst single weight")
    right = max(r["bits_per_weight"] for r in rows) * 1.45 + 0.5  # room for the labels
    for ax, key in ((ax1, "sqnr_db"), (ax2, "max_abs_err")):
        ax.grid(True, alpha=0.3)
        ax.set_xlim(0, right)
        pts = [(r["bits_per_weight"], r[key], r["format"]) for r in rows
               if r[key] is not None and math.isfinite(r[key]) and r[key] > 0]
        _points_and_labels(ax, pts)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)


def run_demo(size="200MB", out=None, device="auto", plot="cuquant-demo.png", progress=None,
             overwrite=False, stream=None, formats=None) -> int:
    """Build the synthetic model, quantize it in every format, print the comparison and
    draw it. Returns the exit code."""
    from .. import __version__
    from ..checkpoint import (
        COMMAND_FORMATS,
        FORMATS,
        CheckpointError,
        human_bytes,
        parse_size,
        quantize_checkpoint,
        select_backend,
    )
    from .console import ProgressBar, table

    stream = stream or sys.stdout
    size_bytes = parse_size(size)
    backend = select_backend(device)
    if out is not None:
        work = Path(out)
        if work.exists():
            if not overwrite:
                raise CheckpointError(f"{out}: already exists; pass --overwrite to replace it")
            shutil.rmtree(work)
        work.mkdir(parents=True)
        cleanup = False
    else:
        work = Path(tempfile.mkdtemp(prefix="cuquant-demo-"))
        cleanup = True
    try:
        src = work / "bf16"
        shape = build_model(src, size_bytes)
        print(f"cuquant {__version__} demo: a synthetic Llama-shaped model, {shape.layers} layers, "
              f"hidden {shape.hidden}, {human_bytes(shape.nbytes())} in bfloat16, on "
              f"{backend.name}", file=stream)
        rows = []
        show = progress if progress is not None else sys.stderr.isatty()
        for name in formats or COMMAND_FORMATS:
            fmt = FORMATS.get(name)
            if fmt is not None and not fmt.available():
                print(f"  {name}: skipped, this cuquant has no {fmt.quantize_fn}", file=stream)
                continue
            bar = ProgressBar(f"{name:>12}") if show else None
            try:
                rep = quantize_checkpoint(src, work / name, name, device=backend.name,
                                          progress=bar)
            finally:
                if bar is not None:
                    bar.close()
            g = next(g for g in rep.groups() if g["group"] == name)
            numel = sum(math.prod(r.shape) for r in rep.records if r.action == "quantized")
            rows.append({"format": name, "bytes": rep.bytes_out,
                         "bits_per_weight": 8 * g["bytes_out"] / numel,
                         "sqnr_db": g["sqnr_db"], "max_abs_err": g["max_abs_err"],
                         "seconds": rep.seconds, "quantized": rep.count("quantized"),
                         "kept": rep.count("kept")})
        base = shape.nbytes()
        lines = [["bf16 (input)", "16.00", human_bytes(base), "1.00x", "-", "-", "-"]]
        for r in rows:
            lines.append([r["format"], f"{r['bits_per_weight']:.2f}", human_bytes(r["bytes"]),
                          f"{r['bytes'] / base:.2f}x",
                          "-" if r["sqnr_db"] is None else f"{r['sqnr_db']:.2f}",
                          "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.3e}",
                          f"{r['seconds']:.1f} s"])
        print(table(["format", "bits/weight", "checkpoint", "vs bf16", "SQNR dB", "max |err|",
                     "time"], lines), file=stream)
        if rows:
            print(f"(quantized {rows[0]['quantized']} weight matrices; embeddings, lm_head and "
                  f"norms, {rows[0]['kept']} tensors, stay in bfloat16)", file=stream)
        if plot and str(plot).lower() != "none" and rows:
            try:
                plot_results(rows, plot, f"cuquant {__version__}: {shape.layers}-layer synthetic "
                             f"model, {human_bytes(base)} bf16")
                print(f"chart: {plot}", file=stream)
            except ImportError:
                print("chart skipped: matplotlib is not installed (pip install 'cuquant[plot]')",
                      file=stream)
        if not cleanup:
            print(f"checkpoints: {work}", file=stream)
    finally:
        if cleanup:
            shutil.rmtree(work, ignore_errors=True)
    return 0
