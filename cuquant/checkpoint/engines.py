"""The checkpoint formats that inference engines load: compressed-tensors and AWQ.

Each writer turns one weight ``W [N, K]`` (a Linear layer's, out x in) into the tensors the
format stores beside the module's name, with the library's kernels; each reader turns
them back into ``W`` with the library's dequantizers. The arithmetic of every format is
stated in docs/checkpoint-formats.md. The per-element repacking (int32 words, AWQ's
transposed and interleaved nibbles) runs as array operations on the backend that holds
the codes: CuPy on the GPU, NumPy on the host.

compressed-tensors (``quant_method: "compressed-tensors"``, status ``compressed``):

=============  =================  =========================================================
scheme         format             tensors of module M
=============  =================  =========================================================
W8A8           int-quantized      M.weight I8 [N, K]; M.weight_scale T [N, 1]
FP8_DYNAMIC    float-quantized    M.weight F8_E4M3 [N, K]; M.weight_scale T [N, 1]
W4A16          pack-quantized     M.weight_packed I32 [N, K/8]; M.weight_scale T [N, K/G];
                                  M.weight_shape I64 [2]
W4A16_ASYM     pack-quantized     as W4A16, plus M.weight_zero_point I32 [ceil(N/8), K/G]
W8A16          pack-quantized     M.weight_packed I32 [N, K/4]; M.weight_scale T [N, K/G];
                                  M.weight_shape I64 [2]
=============  =================  =========================================================

AWQ (``quant_method: "awq"``, ``version: "gemm"``): M.qweight I32 [K, N/8], M.qzeros I32
[K/G, N/8], M.scales F16 [K/G, N].

The microscaling formats (`FP4_FORMATS`, weight-only; their work in microscaling.py):
NVFP4 (nvfp4-pack-quantized): M.weight_packed U8 [N, K/2]; M.weight_scale F8_E4M3 [N, K/16];
M.weight_global_scale F32 [1]. MXFP4 (mxfp4-pack-quantized): M.weight_packed U8 [N, K/2];
M.weight_scale U8 [N, K/32] (E8M0 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Nibble i of an AWQ word (bits 4i..4i+3) holds output channel 8c + AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
HALF_DTYPES = ("F16", "BF16")
_NP_OF = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


@dataclass(frozen=True)
class EngineFormat:
    """One format an engine loads.

    Attributes
    ----------
    name : str
        As given to ``--format``: the compressed-tensors scheme, or "AWQ".
    about : str
    method : {"compressed-tensors", "awq"}
    ct_format : str
        compressed-tensors' format name ("" for AWQ).
    bits : int
    symmetric : bool
    grouped : bool
        Scales per group of `group_size` along K (else one per output channel).
    codes : {"int8", "fp8", "packed", "awq"}
    """

    name: str
    about: str
    method: str
    ct_format: str
    bits: int
    symmetric: bool
    grouped: bool
    codes: str

    @property
    def row_align(self) -> int:
        """Rows a band starts at a multiple of: 8 for the asymmetric packed format, whose
        zero points are packed eight rows a word."""
        return 8 if self.codes == "packed" and not self.symmetric else 1

    def unfit(self, n: int, k: int, dtype: str, g: int) -> str | None:
        """Why a float weight [n, k] of safetensors dtype `dtype` cannot take this format."""
        if self.codes in ("packed", "awq"):
            if dtype not in HALF_DTYPES:
                return f"{_NP_OF.get(dtype, dtype)} weights: {self.name} is written from " \
                       "float16 or bfloat16 weights"
            if k % g:
                return f"K={k} is not a multiple of the group size {g}"
            if k % 8:
                return f"K={k} is not a multiple of 8 (eight 4-bit codes an int32 word)"
        if self.codes == "awq" and n % 8:
            return f"N={n} is not a multiple of 8 (AWQ packs eight output channels a word)"
        return None

    def outputs(self, base: str, n: int, k: int, dtype: str, g: int) -> list[tuple]:
        """(name, safetensors dtype, shape) of what a weight [n, k] becomes."""
        if self.codes == "int8":
            return [(base + "weight", "I8", (n, k)), (base + "weight_scale", dtype, (n, 1))]
        if self.codes == "fp8":
            return [(base + "weight", "F8_E4M3", (n, k)), (base + "weight_scale", dtype, (n, 1))]
        if self.codes == "packed":
            out = [(base + "weight_packed", "I32", (n, k * self.bits // 32)),
                   (base + "weight_scale", dtype, (n, k // g)),
                   (base + "weight_shape", "I64", (2,))]
            if not self.symmetric:
                out.append((base + "weight_zero_point", "I32", (-(-n * self.bits // 32), k // g)))
            return out
        return [(base + "qweight", "I32", (k, n // 8)), (base + "qzeros", "I32", (k // g, n // 8)),
                (base + "scales", "F16", (k // g, n))]

    def scheme(self, g: int) -> dict:
        """compressed-tensors' QuantizationScheme of config group ``group_0``."""
        weights = {"num_bits": self.bits, "type": "float" if self.codes == "fp8" else "int",
                   "symmetric": self.symmetric, "strategy": "group" if self.grouped else "channel",
                   "group_size": g if self.grouped else None, "dynamic": False}
        acts = None
        if self.name in ("W8A8", "FP8_DYNAMIC"):
            acts = {"num_bits": 8, "type": weights["type"], "symmetric": True,
                    "strategy": "token", "group_size": None, "dynamic": True}
        return {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                "output_activations": None, "format": self.ct_format}


ENGINE_FORMATS: dict[str, EngineFormat] = {f.name: f for f in (
    EngineFormat("W8A8", "int8 per output channel, scale in the model dtype; int8 per-token "
                 "activations (compressed-tensors int-quantized)", "compressed-tensors",
                 "int-quantized", 8, True, False, "int8"),
    EngineFormat("FP8_DYNAMIC", "float8_e4m3fn per output channel, scale in the model dtype; "
                 "fp8 per-token activations (compressed-tensors float-quantized)",
                 "compressed-tensors", "float-quantized", 8, True, False, "fp8"),
    EngineFormat("W4A16", "symmetric int4, groups of G along K, scale in the model dtype "
                 "(compressed-tensors pack-quantized)", "compressed-tensors", "pack-quantized",
                 4, True, True, "packed"),
    EngineFormat("W4A16_ASYM", "int4 with zero points, groups of G along K (compressed-tensors "
                 "pack-quantized)", "compressed-tensors", "pack-quantized", 4, False, True,
                 "packed"),
    EngineFormat("W8A16", "symmetric int8, groups of G along K (compressed-tensors "
                 "pack-quantized, 8 bits)", "compressed-tensors", "pack-quantized", 8, True, True,
                 "packed"),
    EngineFormat("AWQ", "int4 with zero points, groups of G along K, float16 scales (AWQ gemm: "
                 "lmdeploy TurboMind, vLLM)", "awq", "", 4, False, True, "awq"),
)}


def ct_quantization_config(fmt: EngineFormat, g: int, ignored: list[str]) -> dict:
    """config.json's quantization_config for a compressed-tensors checkpoint."""
    return {"quant_method": "compressed-tensors", "format": fmt.ct_format,
            "quantization_status": "compressed", "config_groups": {"group_0": fmt.scheme(g)},
            "ignore": list(ignored), "kv_cache_scheme": None}


def awq_quantization_config(g: int, ignored: list[str]) -> dict:
    return {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": g,
            "zero_point": True, "modules_to_not_convert": list(ignored) or None}


# ---------------------------------------------------------------------------------------
# Packing, on the backend's array module `xp`

def words_of_bytes(xp, b):
    """uint8 [R, 4C] -> int32 [R, C]: byte 4c + j is bits 8j..8j+7 of word c (little-endian,
    as safetensors stores int32)."""
    b = xp.ascontiguousarray(b)
    return b.view(xp.int32) if b.size else xp.zeros((b.shape[0], b.shape[1] // 4), xp.int32)


def bytes_of_words(xp, w):
    """int32 [R, C] -> uint8 [R, 4C], the inverse of `words_of_bytes`."""
    w = xp.ascontiguousarray(w).astype(xp.int32, copy=False)
    return w.view(xp.uint8) if w.size else xp.zeros((w.shape[0], w.shape[1] * 4), xp.uint8)


def nibbles(xp, packed):
    """uint8 [R, C] (two 4-bit codes a byte, first in the low nibble) -> uint8 [R, 2C]."""
    out = xp.empty((packed.shape[0], packed.shape[1] * 2), xp.uint8)
    out[:, 0::2] = packed & 15
    out[:, 1::2] = packed >> 4
    return out


def pack_nibbles(xp, codes):
    """uint8 [R, 2C] of values in [0, 15] -> uint8 [R, C], the first of a pair low."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(xp.uint8)


def pack_rows_4bit(xp, z):
    """uint8 [N, C] in [0, 15] -> int32 [ceil(N/8), C]: row 8r + j in bits 4j.. of word row r
    (compressed-tensors' zero points, packed along the output dimension; missing rows 0)."""
    n, c = z.shape
    r = -(-n // 8)
    full = xp.zeros((r * 8, c), xp.uint8)
    full[:n] = z
    t = xp.ascontiguousarray(full.reshape(r, 8, c).transpose(0, 2, 1))    # [r, c, 8]
    b = pack_nibbles(xp, t.reshape(r * c, 8))                               # [r*c, 4]
    return words_of_bytes(xp, b).reshape(r, c)


def unpack_rows_4bit(xp, w, n):
    """The inverse of `pack_rows_4bit`: int32 [ceil(N/8), C] -> uint8 [N, C]."""
    r, c = w.shape
    b = bytes_of_words(xp, w.reshape(r * c, 1))                             # [r*c, 4]
    t = nibbles(xp, b).reshape(r, c, 8).transpose(0, 2, 1)                  # [r, 8, c]
    return xp.ascontiguousarray(t.reshape(r * 8, c)[:n])


def awq_pack(xp, u):
    """uint8 [K, N] of values in [0, 15] -> int32 [K, N/8] in AWQ's interleaved order."""
    k, n = u.shape
    order = xp.asarray(np.array(AWQ_ORDER, np.int64))
    t = u.reshape(k * (n // 8), 8)[:, order]
    return words_of_bytes(xp, pack_nibbles(xp, t)).reshape(k, n // 8)


def awq_unpack(xp, w):
    """int32 [K, N/8] in AWQ's order -> uint8 [K, N]."""
    k, c = w.shape
    t = nibbles(xp, bytes_of_words(xp, w.reshape(k * c, 1)))                # [k*c, 8]
    out = xp.empty_like(t)
    out[:, xp.asarray(np.array(AWQ_ORDER, np.int64))] = t
    return out.reshape(k, c * 8)


# ---------------------------------------------------------------------------------------
# The microscaling formats: compressed-tensors' nvfp4-pack-quantized and
# mxfp4-pack-quantized, weight-only (its NVFP4A16 and MXFP4A16 schemes)

@dataclass(frozen=True)
class FP4Format(EngineFormat):
    """An fp4 (e2m1) format: codes two a byte, the first in the low nibble, one scale per
    `block` elements along K (e4m3 and a float32 global scale for NVFP4, E8M0 bytes for
    MXFP4). Takes float16, bfloat16 and float32 weights."""

    block: int = 16

    def unfit(self, n: int, k: int, dtype: str, g: int) -> str | None:
        if k % self.block:
            return f"K={k} is not a multiple of the {self.name} block of {self.block}"
        return None

    def outputs(self, base: str, n: int, k: int, dtype: str, g: int) -> list[tuple]:
        out = [(base + "weight_packed", "U8", (n, k // 2)),
               (base + "weight_scale", "F8_E4M3" if self.codes == "nvfp4" else "U8",
                (n, k // self.block))]
        if self.codes == "nvfp4":
            out.append((base + "weight_global_scale", "F32", (1,)))
        return out

    def scheme(self, g: int) -> dict:
        nv = self.codes == "nvfp4"
        weights = {"num_bits": 4, "type": "float", "symmetric": True,
                   "strategy": "tensor_group" if nv else "group", "group_size": self.block,
                   "dynamic": False,
                   "scale_dtype": "torch.float8_e4m3fn" if nv else "torch.uint8"}
        return {"targets": ["Linear"], "weights": weights, "input_activations": None,
                "output_activations": None, "format": self.ct_format}


FP4_FORMATS: dict[str, FP4Format] = {f.name: f for f in (
    FP4Format("NVFP4", "fp4 e2m1, an e4m3 scale per 16 along K and a float32 global scale; "
              "weight-only (compressed-tensors nvfp4-pack-quantized)", "compressed-tensors",
              "nvfp4-pack-quantized", 4, True, False, "nvfp4", 16),
    FP4Format("MXFP4", "fp4 e2m1, a power-of-two (E8M0) scale per 32 along K; weight-only "
              "(compressed-tensors mxfp4-pack-quantized)", "compressed-tensors",
              "mxfp4-pack-quantized", 4, True, False, "mxfp4", 32),
)}
ENGINE_FORMATS.update(FP4_FORMATS)
