"""NVFP4 and MXFP4 weights in compressed-tensors' nvfp4-pack-quantized and
mxfp4-pack-quantized layouts: written with the library's quantizers, read back in the
arithmetic of compressed-tensors' own decompression (docs/checkpoint-formats.md).

The codes are section 9's (docs/formats.md): two e2m1 codes a byte, the first in the low
nibble, which is compressed-tensors' packing as it is. NVFP4 stores the global scale as
compressed-tensors does, the *encode* scale ``S_enc = 2688 / global_amax``, and a loader
reconstructs ``f32(q) * (f32(s) / S_enc)``: a division, where section 9's dequantizer
multiplies by ``S_dec = 1 / S_enc``; reading follows the checkpoint's order.
"""

from __future__ import annotations

import numpy as np

from .backend import Backend
from .engines import nibbles
from .formats import CheckpointError
from .report import _worse
from .write import _bands

FLT_MAX = np.float32(np.finfo(np.float32).max)

# e2m1 code (sign in bit 3, then the index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}) -> the
# e4m3 byte of the same value: every e2m1 value is an e4m3 value.
_E4M3_OF_E2M1 = np.array([0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C,
                          0x80, 0xB0, 0xB8, 0xBC, 0xC0, 0xC4, 0xC8, 0xCC], np.uint8)


def encode_scale(global_amax) -> np.float32:
    """compressed-tensors' ``weight_global_scale`` for a float32 global amax A: section 9's
    ``S_enc = 1 if A == 0 else min(f32(2688 / A), FLT_MAX)``."""
    a = np.float32(global_amax)
    if a == 0:
        return np.float32(1)
    with np.errstate(over="ignore"):
        return np.minimum(np.float32(2688) / a, FLT_MAX)


def block_scales(kind: str, scale: np.ndarray, global_scale=None) -> np.ndarray:
    """The float32 multiplier of each block, on the host (exact IEEE arithmetic).

    Parameters
    ----------
    kind : {"nvfp4", "mxfp4"}
    scale : array [R, K/B]: e4m3 codes (NVFP4) or E8M0 bytes (MXFP4), any 1-byte dtype
    global_scale : float32, NVFP4 only
        The stored encode scale: the multiplier is ``f32(f32(s) / global_scale)``.

    Returns
    -------
    float32 array [R, K/B]; an E8M0 byte b gives ``2**(b - 127)`` (0xFF: NaN).
    """
    import ml_dtypes

    raw = np.ascontiguousarray(scale).view(np.uint8)
    if kind == "nvfp4":
        with np.errstate(all="ignore"):
            return raw.view(ml_dtypes.float8_e4m3fn).astype(np.float32) / np.float32(global_scale)
    b = raw.astype(np.uint32)
    bits = np.where(b == 0, np.uint32(0x00400000), b << np.uint32(23))
    bits = np.where(b == 255, np.uint32(0x7FC00000), bits)
    return bits.astype(np.uint32).view(np.float32)


def dequantize_fp4(backend: Backend, packed, mult: np.ndarray, block: int, dtype: str):
    """``dtype(f32(decode(q)) * mult)`` for packed e2m1 codes [R, K/2] (on the backend) and
    float32 multipliers [R, K/B] (host): the codes become e4m3 bytes of the same values and
    go through the library's per-row fp8 dequantizer, a row per block."""
    import cuquant

    xp = backend.xp
    codes = xp.asarray(_E4M3_OF_E2M1)[nibbles(xp, packed)]           # [R, K] e4m3 bytes
    r, k = codes.shape
    x = cuquant.dequantize_fp8_per_row(codes.reshape(r, k // block, block),
                                       backend.to_device(np.ascontiguousarray(mult)), dtype)
    return x.reshape(r, k)


def _not_finite(name: str, fmt) -> CheckpointError:
    return CheckpointError(
        f"tensor {name!r}: NaN or infinite values, which {fmt.name} cannot store (its scales "
        "would be NaN, and loaders decode those differently); keep it in high precision with "
        "--skip")


def _global_amax(backend: Backend, f, name: str, bands, fmt) -> np.float32:
    """max |w| over the whole weight, band by band (each band's maximum is exact in its
    own dtype, so float32 of it is the float32 maximum)."""
    xp = backend.xp
    a = np.float32(0)
    for r0, r1 in bands:
        x = backend.to_device(f.read_rows(name, r0, r1))
        m = np.float32(float(xp.abs(x.astype(xp.float32)).max())) if x.size else np.float32(0)
        if not np.isfinite(m):
            raise _not_finite(name, fmt)
        a = max(a, m)
        del x
    return a


def quantize_fp4_weight(it, ck, w, progress, backend: Backend, chunk: int, stats: bool) -> None:
    """One weight in NVFP4 or MXFP4: bands of rows through ``quantize_nvfp4`` (with the
    whole tensor's amax as its static global amax, read first when there are several
    bands) or ``quantize_mxfp4`` (scale_mode "rceil"), codes and scales written as they come.
    """
    import cuquant

    fmt = it.fmt
    name = it.src.name
    f = ck.file_of(name)
    n, k = it.src.shape
    out = {s.name[len(name) - len("weight"):]: s.name for s in it.outputs}
    bands = list(_bands(n, k, 1, chunk))
    nv = fmt.codes == "nvfp4"
    amax = _global_amax(backend, f, name, bands, fmt) if nv and len(bands) > 1 else None
    s_enc = None
    signal = noise = 0.0
    worst = 0.0
    for r0, r1 in bands:
        host = f.read_rows(name, r0, r1)
        x = backend.to_device(host)
        if nv:
            q, sc, ga = cuquant.quantize_nvfp4(x, global_amax=amax if amax else None)
            if s_enc is None:
                got = np.asarray(backend.to_host(ga), np.float32).reshape(-1)[0]
                if not np.isfinite(got):
                    raise _not_finite(name, fmt)
                s_enc = encode_scale(got)
            sc_host = np.asarray(backend.to_host(sc))
        else:
            q, sc = cuquant.quantize_mxfp4(x, scale_mode="rceil")
            sc_host = np.ascontiguousarray(backend.to_host(sc)).view(np.uint8)
            if np.any(sc_host == 0xFF):
                raise _not_finite(name, fmt)
        w.write(out["weight_packed"], backend.to_host(q))
        w.write(out["weight_scale"], sc_host)
        if stats:
            deq = dequantize_fp4(backend, q, block_scales(fmt.codes, sc_host, s_enc), fmt.block,
                                 "float32")
            a, b, m = backend.error_terms(x, deq)
            signal += a
            noise += b
            worst = _worse(worst, m)
            del deq
        progress.advance(host.nbytes, name)
        del host, x, q, sc
    if nv:
        w.write(out["weight_global_scale"], np.array([s_enc], np.float32))
    it.record.bytes_out = it.out_bytes
    it.record.outputs = [s.name for s in it.outputs]
    if stats:
        it.record.signal, it.record.noise, it.record.max_abs_err = signal, noise, worst
    progress.advance(0, name, finished=True)


def dequantize_fp4_module(m, read, w, out_name: str, progress, backend: Backend,
                          chunk: int) -> None:
    """Restore an NVFP4 or MXFP4 module's weight in bands of rows; `read(role, r0, r1)`
    reads its tensors."""
    gs = None
    if m.kind == "nvfp4":
        gs = np.asarray(read("global_scale"), np.float32).reshape(-1)[0]
    for r0, r1 in _bands(m.n, m.k, 1, chunk):
        packed = read("packed", r0, r1)
        sc = read("scale", r0, r1)
        x = dequantize_fp4(backend, backend.to_device(np.ascontiguousarray(packed).view(np.uint8)),
                           block_scales(m.kind, sc, gs), m.group, m.out_dtype)
        w.write(out_name, backend.to_host(x))
        progress.advance(packed.nbytes + sc.nbytes, out_name)

