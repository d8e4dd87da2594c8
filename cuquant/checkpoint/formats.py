"""The formats a checkpoint's weights take (cuquant's own layouts), the errors the
checkpoint functions raise, sizes, and the UE8M0 rounding of block scales."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .engines import ENGINE_FORMATS


class CheckpointError(Exception):
    """A problem with the user's input or output (shown as one line, no traceback)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Format:
    """One checkpoint format.

    Attributes
    ----------
    name : str
        As given to ``--format``.
    about : str
        One line for help texts and tables.
    quantize_fn, dequantize_fn : str
        The cuquant functions that make and undo it.
    code_dtype : str
        safetensors dtype of the codes, stored under the weight's own name.
    suffix : str
        The companion float32 tensor (scale or params) is stored as ``name + suffix``.
    codes_shape, companion_shape : callable (n, k, g) -> tuple
        Shapes written for a weight [n, k] (g: the group size, where there is one).
    companion_rows : callable (r0, r1, n, k, g) -> (s0, s1)
        The companion's first-axis slice that goes with rows r0:r1 of the weight.
    row_align : int
        Bands of rows start at multiples of this (the block height for tiles).
    grouped : bool
        Whether the functions take ``group_size``.
    """

    name: str
    about: str
    quantize_fn: str
    dequantize_fn: str
    code_dtype: str
    suffix: str
    codes_shape: Callable[[int, int, int], tuple]
    companion_shape: Callable[[int, int, int], tuple]
    companion_rows: Callable[[int, int, int, int, int], tuple]
    row_align: int = 1
    grouped: bool = False

    def function(self, which: str):
        import cuquant

        fn = getattr(cuquant, self.quantize_fn if which == "quantize" else self.dequantize_fn,
                     None)
        if fn is None:
            name = self.quantize_fn if which == "quantize" else self.dequantize_fn
            raise CheckpointError(f"format {self.name} needs cuquant.{name}, which this "
                                  f"version of cuquant ({cuquant.__version__}) does not have")
        return fn

    def available(self) -> bool:
        import cuquant

        return hasattr(cuquant, self.quantize_fn) and hasattr(cuquant, self.dequantize_fn)

    def unfit(self, n: int, k: int, g: int) -> str | None:
        """Why a weight [n, k] cannot take this format, or None."""
        if self.grouped and (k % g or k % 2):
            return f"K={k} is not a multiple of the group size {g}"
        return None


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp8-block", "float8_e4m3fn, one float32 scale per 128x128 tile (DeepSeek-V3)",
           "quantize_fp8_per_block", "dequantize_fp8_per_block", "F8_E4M3", "_scale_inv",
           codes_shape=lambda n, k, g: (n, k),
           companion_shape=lambda n, k, g: (_cdiv(n, 128), _cdiv(k, 128)),
           companion_rows=lambda r0, r1, n, k, g: (r0 // 128, _cdiv(r1, 128)),
           row_align=128),
    Format("int8-channel", "int8, one float32 scale per output channel (row)",
           "quantize_int8_per_channel", "dequantize_int8_per_channel", "I8", "_scale",
           codes_shape=lambda n, k, g: (n, k),
           companion_shape=lambda n, k, g: (n,),
           companion_rows=lambda r0, r1, n, k, g: (r0, r1)),
    Format("int4-group", "int4 two per byte, float32 (inverse multiplier, offset) per group",
           "quantize_int4_per_group", "dequantize_int4_per_group", "I8", "_params",
           codes_shape=lambda n, k, g: (n, k // 2),
           companion_shape=lambda n, k, g: (n * k // g, 2),
           companion_rows=lambda r0, r1, n, k, g: (r0 * k // g, r1 * k // g),
           grouped=True),
    Format("fp8-row", "float8_e4m3fn, one float32 scale per row",
           "quantize_fp8_per_row", "dequantize_fp8_per_row", "F8_E4M3", "_scale",
           codes_shape=lambda n, k, g: (n, k),
           companion_shape=lambda n, k, g: (n,),
           companion_rows=lambda r0, r1, n, k, g: (r0, r1)),
)}


# What `cuquant quantize` writes: the formats engines load.
COMMAND_FORMATS = (*ENGINE_FORMATS, "fp8-block")


# The formats no engine loads: written from Python only, read by dequantize and inspect.
LEGACY_FORMATS = ("int8-channel", "int4-group", "fp8-row")


SCALE_FORMATS = ("float32", "ue8m0")


FLOAT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


_ST_OF_FLOAT = {v: k for k, v in FLOAT_DTYPES.items()}


# Kept in high precision unless --no-default-skip: matched against whole tensor names
# (fnmatch, case-sensitive). Embeddings, the output head, norms and MoE routers. The router
# pattern names the module exactly: "*.gate.weight" catches mlp.gate but not mlp.gate_proj.
DEFAULT_SKIP = (
    "*embed*", "wte.*", "*.wte.*", "wpe.*", "*.wpe.*",
    "lm_head.*", "*.lm_head.*",
    "*norm*",
    "*.gate.weight", "*router*", "*shared_expert_gate*",
    "*.bias",
)


# Skipped 2-D weights that are not Linear layers (so not listed as ignored layers).
_EMBEDDINGS = ("*embed*", "wte.*", "*.wte.*", "wpe.*", "*.wpe.*")


# Files of a model directory that are weights in some other form: never copied.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
                    ".gguf", ".index.json")


CPU_CHUNK = 1 << 22  # elements per band of rows: the NumPy backend's temporaries stay ~100 MB


GPU_CHUNK = 1 << 27


def parse_size(text) -> int:
    """Bytes from "5GB", "500MB", "2GiB", "1e9" or an int (decimal units are powers of 1000)."""
    if isinstance(text, (int, np.integer)):
        return int(text)
    s = str(text).strip().upper().replace(" ", "")
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "K": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12, "B": 1}
    for unit in sorted(units, key=len, reverse=True):
        if s.endswith(unit):
            num, mult = s[: -len(unit)], units[unit]
            break
    else:
        num, mult = s, 1
    try:
        value = float(num) * mult
    except ValueError:
        raise CheckpointError(f"cannot read {text!r} as a size (try 5GB, 500MB, 2GiB)") from None
    if value <= 0 or not math.isfinite(value):
        raise CheckpointError(f"size must be positive; got {text!r}")
    return int(value)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def ceil_pow2(s: np.ndarray) -> np.ndarray:
    """The smallest power of two >= each float32 value (exact, from the float's own bits
    through float64, where every float32 is exact); NaN and inf stay."""
    s = np.asarray(s, dtype=np.float32)
    m, e = np.frexp(s.astype(np.float64))
    p = np.where(m == 0.5, s.astype(np.float64), np.ldexp(1.0, e))
    return np.where(np.isfinite(s) & (s > 0), p, s).astype(np.float32)
