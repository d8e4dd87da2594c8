"""Writes the notebooks of this folder from the cell sources below (nbformat v4, no outputs).

    python notebooks/_build.py           # rewrite every notebook
    python notebooks/_build.py --check   # exit 1 when a notebook differs from its source here

Edit the cells here, not in Jupyter, then run the script: tests/test_notebooks.py checks that
the committed notebooks match this file and executes each of them.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

# Every notebook starts with this cell: the installed cuquant, or the checkout's own when the
# notebook runs from a clone that was never installed.
SETUP = '''
import pathlib
import sys

try:
    import cuquant
except ImportError:  # a clone that was not installed: use the checkout this notebook is in
    for parent in (pathlib.Path.cwd().resolve(), *pathlib.Path.cwd().resolve().parents):
        if (parent / "cuquant" / "__init__.py").is_file():
            sys.path.insert(0, str(parent))
            break
    import cuquant
'''

# Finds a usable CUDA device through CuPy; shared by the notebooks that have GPU cells.
GPU_CHECK = '''
def find_gpu():
    """(cupy module or None, one line that says why)."""
    try:
        import cupy
    except Exception as exc:  # not installed, or a CuPy without its CUDA libraries
        return None, f"CuPy is not importable ({type(exc).__name__}); install cuquant[cuda12] or cuquant[cuda13]"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, or a driver too old for this CuPy
        return None, f"CuPy {cupy.__version__} is installed but finds no usable CUDA device ({type(exc).__name__})"
    if count == 0:
        return None, f"CuPy {cupy.__version__} is installed but there is no CUDA device"
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return cupy, f"CuPy {cupy.__version__}, {count} CUDA device(s), device 0 is {name}"
'''


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(textwrap.dedent(text).strip("\n"))


# ---------------------------------------------------------------------------------------
# 01: quickstart

QUICKSTART = [
    md("""
    # cuquant quickstart

    cuquant quantizes and dequantizes arrays in the formats that LLM inference uses (INT8,
    FP8 e4m3, INT4 group-wise). Every function takes NumPy, CuPy, PyTorch or JAX arrays:
    arrays on a CUDA device run the GPU kernels, host arrays run a NumPy backend that gives
    **the same bits**. This notebook runs on any machine; the cells that need a GPU say so
    and skip themselves without one.

    1. Check the install
    2. Quantize and dequantize a weight matrix, format by format: codes, scales, layout
    3. Every format at a glance
    4. GPU or NumPy backend: what runs where
    5. The `cuquant` command for whole checkpoints
    """),
    md("## 1. Check the install"),
    code(SETUP),
    code(GPU_CHECK + '''

import importlib.util
import platform

import ml_dtypes
import numpy as np

print(f"cuquant {cuquant.__version__} from {pathlib.Path(cuquant.__file__).parent}")
print(f"python {platform.python_version()}, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}")
cp, gpu_line = find_gpu()
HAVE_GPU = cp is not None
print("GPU:", gpu_line)
for name in ("torch", "jax"):
    print(f"{name}: {'installed' if importlib.util.find_spec(name) else 'not installed (optional)'}")
'''),
    md("""
    ## 2. A weight matrix, format by format

    A small bfloat16 matrix `[N, K]` (N output rows, K input channels) whose rows have
    different scales, as trained weights do. bfloat16 has no NumPy dtype of its own:
    cuquant uses `ml_dtypes.bfloat16`, which NumPy arrays carry like any other dtype.
    """),
    code('''
rng = np.random.default_rng(0)
N, K = 512, 1024
w32 = rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.02)
w32 *= rng.lognormal(0.0, 0.5, size=(N, 1)).astype(np.float32)  # each row its own scale
w = w32.astype(ml_dtypes.bfloat16)
x = w.astype(np.float32)  # the exact values of w, for measuring errors
row_amax = np.abs(x).max(axis=1)
print(w.dtype, w.shape, f"{w.nbytes / 2**20:.2f} MiB")
print(f"row amax from {row_amax.min():.4f} to {row_amax.max():.4f} "
      f"({row_amax.max() / row_amax.min():.1f}x apart)")
'''),
    md("""
    ### INT8, one scale per output channel

    `quantize_int8_per_channel` gives int8 codes and one float32 scale per row:
    `scale = amax(|row|) / 127` and `q = round(x / scale)`, so `x ~= q * scale`.
    Dequantization takes the output dtype (a NumPy, ml_dtypes, torch or JAX dtype, or its
    name). The error of each weight is at most half a step (the step is the row's scale)
    when dequantizing to float32; a bfloat16 output adds its own rounding on top. Compare the
    two `max |error| / scale` lines below.
    """),
    code('''
q, scale = cuquant.quantize_int8_per_channel(w)
print("codes:", q.dtype, q.shape, "row 0 starts", q[0, :8])
print("scale:", scale.dtype, scale.shape, "first rows", scale[:4])

w_hat = cuquant.dequantize_int8_per_channel(q, scale, "bfloat16")
print("dequantized:", w_hat.dtype, w_hat.shape)
for out in (np.float32, ml_dtypes.bfloat16):
    err = cuquant.dequantize_int8_per_channel(q, scale, out).astype(np.float32) - x
    print(f"to {np.dtype(out).name:8s}: max |error| {np.abs(err).max():.3e}, "
          f"max |error| / scale {(np.abs(err) / scale[:, None]).max():.3f} steps")
'''),
    md("""
    The formats are specified to the bit, so plain NumPy reproduces them. Here is the
    per-channel rule written out (float32 arithmetic, round half to even); the library's
    codes and scales are identical to it, bit for bit.
    """),
    code('''
s_ref = row_amax * np.float32(1 / 127)
s_ref[s_ref == 0] = 1
q_ref = np.clip(np.rint(x / s_ref[:, None]), -127, 127).astype(np.int8)
print("scales identical:", np.array_equal(s_ref.view(np.uint32), scale.view(np.uint32)))
print("codes identical: ", np.array_equal(q_ref, q))
'''),
    md("""
    ### FP8 e4m3

    FP8 codes are floating-point numbers with 4 exponent and 3 mantissa bits, largest
    finite value 448. On the host they come back as `ml_dtypes.float8_e4m3fn` arrays (view
    them as `uint8` to see the raw bytes). Unlike int8's evenly spaced steps, e4m3 values are
    spaced in proportion to their size: 3 mantissa bits give 8 steps between each power of
    two and the next, at every magnitude (see the two ranges printed last).
    """),
    code('''
q8, s8 = cuquant.quantize_fp8_per_tensor(w)
print("codes:", q8.dtype, q8.shape, "row 0 starts", q8[0, :6])
print("raw bytes:", q8[0, :6].view(np.uint8))
print("scale:", s8, "= amax / 448:", np.abs(x).max() / np.float32(448))
print("distinct codes used:", np.unique(q8.view(np.uint8)).size, "of 256 bit patterns")

e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
finite = np.sort(e4m3[np.isfinite(e4m3.astype(np.float32))].astype(np.float32))
print("values between 1 and 2:", finite[(finite >= 1) & (finite <= 2)])
print("values between 256 and 448:", finite[finite >= 256])
'''),
    md("""
    Finer granularities of FP8 keep more of each row's precision:

    * `quantize_fp8_per_row`: one scale per row (last axis; any rank).
    * `quantize_fp8_per_token_group`: one scale per group of 128 (or 32, 64, 256) elements
      of a row, as DeepSeek-V3 and vLLM quantize activations. `scale_format="ue8m0"` rounds
      each scale up to a power of two; `scale_layout="column"` stores the scales
      column-major with the row count padded to 4, the layout DeepGEMM reads.
    * `quantize_fp8_per_block`: one scale per 128x128 tile, DeepSeek-V3's weight format
      (`weight_scale_inv`).
    """),
    code('''
qr, sr = cuquant.quantize_fp8_per_row(w)
print("per row:   scale", sr.shape)

qg, sg = cuquant.quantize_fp8_per_token_group(w, group_size=128)
print("per group: scale", sg.shape, "(rows, K / 128)")

qu, su = cuquant.quantize_fp8_per_token_group(w, group_size=128, scale_format="ue8m0")
print("ue8m0:     log2 of the first scales", np.log2(su[0, :4]), "(whole numbers)")

qc, sc = cuquant.quantize_fp8_per_token_group(w, group_size=128, scale_layout="column")
print("column layout: shape", sc.shape, "strides", sc.strides,
      "same values as row layout:", np.array_equal(sc, sg))

qb, sb = cuquant.quantize_fp8_per_block(w)
print("per block: scale", sb.shape, "(ceil(N / 128), ceil(K / 128))")
wb = cuquant.dequantize_fp8_per_block(qb, sb, np.float32)
print(f"per block: max |error| {np.abs(wb - x).max():.3e}")
'''),
    md("""
    ### INT4, two codes a byte

    `quantize_int4_per_group` (asymmetric, one `(1 / multiplier, offset)` pair per group of
    128 along K, DeepSpeed's parameters) packs two signed 4-bit codes into each int8 byte,
    **the first element of each pair in the high nibble**. Unpacking by hand and applying
    `q * p0 + p1` in float32 reproduces `dequantize_int4_per_group` exactly.
    """),
    code('''
G = 128
packed, params = cuquant.quantize_int4_per_group(w, group_size=G)
print("packed:", packed.dtype, packed.shape, " params:", params.dtype, params.shape)

hi = packed >> 4         # first element of each pair; the arithmetic shift keeps the sign
lo = (packed << 4) >> 4  # second element
codes = np.stack([hi, lo], axis=-1).reshape(N, K)
print("codes range", codes.min(), "to", codes.max())

p = params.reshape(N, K // G, 2)
by_hand = codes.reshape(N, K // G, G).astype(np.float32) * p[..., :1] + p[..., 1:]
w4 = cuquant.dequantize_int4_per_group(packed, params, np.float32, group_size=G)
print("unpacked by hand == dequantize_int4_per_group:", np.array_equal(by_hand.reshape(N, K), w4))
print(f"max |error| {np.abs(w4 - x).max():.3e}")
'''),
    md("""
    `quantize_groupwise_zero_point` is the other 4-bit family (lmdeploy's layout): unsigned
    codes with an integer zero point, scales and zeros in the input's dtype, and **the first
    element of each pair in the low nibble**. It also returns the reconstruction, so no
    separate dequantization is needed.

    `rounding="stochastic"` with a `seed` rounds up or down at random, with the same random
    words on CPU and GPU. Each draw is further from `w` than rounding to nearest, but the
    draws are unbiased: their average converges to `w`, which is what training and
    gradient compression need. The last lines show it with 16 seeds.
    """),
    code('''
qz, scales, zeros, w_zp = cuquant.quantize_groupwise_zero_point(w, bits=4, group_size=G)
print("codes:", qz.dtype, qz.shape, " scales:", scales.dtype, scales.shape, " zeros:", zeros.shape)
print("first byte", hex(qz[0, 0]), "-> element 0 is", qz[0, 0] & 0xF, ", element 1 is", qz[0, 0] >> 4)
again = cuquant.dequantize_groupwise_zero_point(qz, scales, zeros, G, ml_dtypes.bfloat16)
print("dequantize_groupwise_zero_point == returned reconstruction:",
      np.array_equal(again.view(np.uint16), w_zp.view(np.uint16)))

def rms(a):
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))


draws = [cuquant.quantize_groupwise_zero_point(w, bits=4, group_size=G, rounding="stochastic",
                                               seed=seed)[3].astype(np.float32)
         for seed in range(16)]
print(f"rms error: nearest {rms(w_zp.astype(np.float32) - x):.2e}, "
      f"one stochastic draw {rms(draws[0] - x):.2e}, "
      f"mean of {len(draws)} draws {rms(np.mean(draws, axis=0) - x):.2e}")
'''),
    md("""
    ## 3. Every format at a glance

    One line per format on the same matrix: what is stored, how many bits each weight
    costs once the scales are counted, and the error. SQNR is
    `10 log10(sum w^2 / sum (w - w_hat)^2)` in dB: higher is better, and each extra bit of
    precision is worth about 6 dB. Notebook 02 compares the formats in depth.
    """),
    code('''
F32 = np.float32


def zero_point(bits):
    def run(a):
        qq, s, z, _ = cuquant.quantize_groupwise_zero_point(a, bits=bits, group_size=128)
        return (qq, s, z), cuquant.dequantize_groupwise_zero_point(qq, s, z, 128, F32)
    return run


def pair(quantize, dequantize, **kw):
    """A format whose quantizer returns (codes, scale) and whose dequantizer takes them back."""
    def run(a):
        qq, s = quantize(a, **kw)
        return (qq, s), dequantize(qq, s, F32, **kw)
    return run


def deepspeed(bits, symmetric):
    def run(a):
        qq, prm = cuquant.quantize_groupwise(a, bits, symmetric, 128)
        return (qq, prm), cuquant.dequantize_groupwise(qq, prm, bits, symmetric, 128, F32)
    return run


FORMATS = {
    "int8 per-tensor": pair(cuquant.quantize_int8_per_tensor, cuquant.dequantize_int8_per_tensor),
    "int8 per-channel": pair(cuquant.quantize_int8_per_channel, cuquant.dequantize_int8_per_channel),
    "int8 per-block 128": pair(cuquant.quantize_int8_per_block, cuquant.dequantize_int8_per_block,
                               block_size=128),
    "fp8 per-tensor": pair(cuquant.quantize_fp8_per_tensor, cuquant.dequantize_fp8_per_tensor),
    "fp8 per-row": pair(cuquant.quantize_fp8_per_row, cuquant.dequantize_fp8_per_row),
    "fp8 per-token-group 128": pair(cuquant.quantize_fp8_per_token_group,
                                    cuquant.dequantize_fp8_per_token_group, group_size=128),
    "fp8 per-block 128x128": pair(cuquant.quantize_fp8_per_block, cuquant.dequantize_fp8_per_block),
    "int8 group 128 (DeepSpeed, asym)": deepspeed(8, False),
    "int4 group 128 (DeepSpeed, sym)": deepspeed(4, True),
    "int4 group 128 (asym)": pair(cuquant.quantize_int4_per_group,
                                  cuquant.dequantize_int4_per_group, group_size=128),
    "uint8 zero-point 128": zero_point(8),
    "uint4 zero-point 128": zero_point(4),
}


def sqnr_db(ref, approx):
    ref = ref.astype(np.float64)
    noise = np.sum((ref - approx.astype(np.float64)) ** 2)
    return np.inf if noise == 0 else 10 * np.log10(np.sum(ref**2) / noise)


def describe(a):
    return f"{a.dtype}{list(a.shape)}"


print(f"{'format':34s} {'stored':56s} {'bits/w':>6s} {'SQNR dB':>8s} {'max |err|':>10s}")
results = {}
for name, run in FORMATS.items():
    stored, approx = run(w)
    results[name] = stored
    bits = 8 * sum(a.nbytes for a in stored) / w.size
    line = " + ".join(describe(a) for a in stored)
    print(f"{name:34s} {line:56s} {bits:6.2f} {sqnr_db(x, approx):8.2f} "
          f"{np.abs(approx - x).max():10.3e}")
'''),
    md("""
    ## 4. GPU or NumPy backend: what runs where

    The array you pass decides where the work runs; there is no device argument:

    | input | runs | results |
    |---|---|---|
    | NumPy (or any host DLPack array) | NumPy backend, on the CPU | NumPy arrays |
    | CuPy | CUDA kernels, on the array's device and the current CuPy stream | CuPy arrays |
    | `torch.Tensor` on CPU / CUDA | NumPy backend / CUDA kernels | torch tensors on the same device |
    | `jax.Array` on CPU / GPU | NumPy backend / CUDA kernels | JAX arrays on the same device |

    Both paths implement one bit-exact specification, so the GPU reproduces every code and
    scale computed above. The first GPU call of each kernel compiles it (NVRTC) and caches
    it; later calls launch directly. The next cell checks every format of section 3 on the
    GPU against the NumPy results, when there is a GPU.
    """),
    code('''
if HAVE_GPU:
    w_gpu = cp.asarray(w)
    for name, run in FORMATS.items():
        stored_gpu, _ = run(w_gpu)
        same = all(np.array_equal(cp.asnumpy(g).view(np.uint8), h.view(np.uint8))
                   for g, h in zip(stored_gpu, results[name]))
        print(f"{name:34s} GPU results {type(stored_gpu[0]).__module__.split('.')[0]:5s} "
              f"bit-identical to NumPy: {same}")
    qb_gpu, _ = cuquant.quantize_fp8_per_block(w_gpu)
    print("fp8 codes on CuPy are", qb_gpu.dtype, "(CuPy has no float8 dtype);",
          "view them on the host with .get().view(ml_dtypes.float8_e4m3fn)")
else:
    print("No GPU here:", gpu_line)
    print("Every call above ran the NumPy backend. With a CUDA GPU and CuPy, pass CuPy, "
          "torch.cuda or JAX GPU arrays and the same calls run the CUDA kernels, same bits.")
'''),
    md("""
    ## 5. Whole checkpoints from the command line

    The `cuquant` command quantizes safetensors checkpoints with these kernels (on the GPU
    when there is one, else with the NumPy backend), streaming one band of rows at a time:

    ```bash
    cuquant demo                                               # a synthetic model, every format
    cuquant quantize ./Llama-3.1-8B ./Llama-3.1-8B-FP8 --format fp8-block
    cuquant inspect ./Llama-3.1-8B-FP8
    cuquant dequantize ./Llama-3.1-8B-FP8 ./Llama-3.1-8B-restored
    ```
    """),
    code('''
import os
import subprocess

env = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(pathlib.Path(cuquant.__file__).parent.parent), os.environ.get("PYTHONPATH", "")]))
done = subprocess.run([sys.executable, "-m", "cuquant", "--help"], capture_output=True,
                      text=True, env=env, timeout=120)
print(done.stdout or done.stderr)
'''),
    md("""
    Next: `02-formats-and-error.ipynb` compares every format on a realistic weight matrix,
    `03-interop.ipynb` passes PyTorch, JAX and CuPy arrays, and `04-performance.ipynb`
    plots the GPU benchmark.
    """),
]


# ---------------------------------------------------------------------------------------
# 02: formats and error

FORMATS_AND_ERROR = [
    md("""
    # Formats and their error

    One weight matrix that looks like a trained one goes through every format and
    granularity cuquant offers. We measure what each costs in bits per weight and what it
    gives back in accuracy, look at the error distributions, and see what per-block scales
    capture. Every number is computed below from this matrix, so it changes if you change
    the matrix: read the plots for the pattern, then try your own weights.

    Everything here runs on the CPU with the NumPy backend (the GPU gives the same bits).
    """),
    code(SETUP),
    code('''
import time

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
from matplotlib.colors import LogNorm

BF16, F32 = ml_dtypes.bfloat16, np.float32
'''),
    md("""
    ## The weight matrix

    A bfloat16 `[N, K]` = `[2048, 4096]` linear layer weight with the three features that
    make quantization hard:

    * **row scales**: each output row has its own magnitude (log-normal spread);
    * **outlier input channels**: a few columns are an order of magnitude larger in every row;
    * **rare large weights**: about one weight in ten thousand is far out in the tails.
    """),
    code('''
rng = np.random.default_rng(2024)
N, K = 2048, 4096
w32 = rng.standard_normal((N, K), dtype=np.float32)
w32 *= (0.02 * rng.lognormal(0.0, 0.5, size=(N, 1))).astype(np.float32)  # row scales
outlier_cols = np.sort(rng.choice(K, size=8, replace=False))
w32[:, outlier_cols] *= rng.uniform(8.0, 20.0, size=8).astype(np.float32)  # outlier channels
tails = rng.random((N, K), dtype=np.float32) < 1e-4
w32[tails] *= rng.uniform(6.0, 15.0, size=int(tails.sum())).astype(np.float32)  # rare large weights
W = w32.astype(BF16)
x = W.astype(F32)  # the exact values of W

row_amax, col_amax = np.abs(x).max(axis=1), np.abs(x).max(axis=0)
print(f"W: {W.dtype} {W.shape}, {W.nbytes / 2**20:.0f} MiB")
print(f"row amax spans {row_amax.max() / row_amax.min():.1f}x; outlier columns {outlier_cols.tolist()}")
print(f"median column amax {np.median(col_amax):.3f}, outlier columns' amax "
      f"{col_amax[outlier_cols].min():.3f} to {col_amax[outlier_cols].max():.3f}")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.5))
ax1.plot(np.sort(row_amax)[::-1])
ax1.set(yscale="log", xlabel="output row (sorted by amax)", ylabel="max |w| of the row",
        title="Row scales")
ax2.plot(col_amax, lw=0.6)
ax2.plot(outlier_cols, col_amax[outlier_cols], "o", color="C3", label="outlier input channels")
ax2.set(yscale="log", xlabel="input channel (column)", ylabel="max |w| of the column",
        title="Column maxima")
ax2.legend()
fig.tight_layout()
plt.show()
'''),
    md("""
    ## Every format

    Each entry quantizes `W`, keeps what a checkpoint would store (codes plus scales,
    offsets or zero points), and dequantizes to float32 so that the error we measure is the
    format's alone, not the rounding of a bfloat16 output. Bits per weight count every
    stored byte. Also included: SmoothQuant-style smoothing (`smooth_quant`), which divides
    each column by a factor `s_k = sqrt(col_amax_k)` before per-row int8 quantization (in a
    model the factors move into the activations; here we multiply them back to compare
    weights).
    """),
    code('''
def pair(quantize, dequantize, quantize_only=None, **kw):
    """A format whose quantizer returns (codes, scale) and whose dequantizer takes them back;
    `kw` go to both, `quantize_only` to the quantizer alone."""
    def run(a):
        q, s = quantize(a, **kw, **(quantize_only or {}))
        return (q, s), dequantize(q, s, F32, **kw)
    return run


def deepspeed(bits, symmetric, group):
    def run(a):
        q, p = cuquant.quantize_groupwise(a, bits, symmetric, group)
        return (q, p), cuquant.dequantize_groupwise(q, p, bits, symmetric, group, F32)
    return run


def int4_asym(group):
    def run(a):
        q, p = cuquant.quantize_int4_per_group(a, group_size=group)
        return (q, p), cuquant.dequantize_int4_per_group(q, p, F32, group_size=group)
    return run


def zero_point(bits, group, **kw):
    def run(a):
        q, s, z, _ = cuquant.quantize_groupwise_zero_point(a, bits=bits, group_size=group, **kw)
        return (q, s, z), cuquant.dequantize_groupwise_zero_point(q, s, z, group, F32)
    return run


def smoothed(a):
    smooth = np.sqrt(np.abs(a.astype(F32)).max(axis=0)).astype(F32)
    smooth /= smooth.mean()
    q, s = cuquant.smooth_quant(a, smooth)
    return (q, s, smooth), cuquant.dequantize_int8_per_channel(q, s, F32) * smooth


c = cuquant
FORMATS = [  # (name, family, run)
    ("int8 per-tensor", "int8", pair(c.quantize_int8_per_tensor, c.dequantize_int8_per_tensor)),
    ("int8 per-channel", "int8", pair(c.quantize_int8_per_channel, c.dequantize_int8_per_channel)),
    ("int8 smoothed + per-channel", "int8", smoothed),
    ("int8 per-block 128", "int8", pair(c.quantize_int8_per_block, c.dequantize_int8_per_block,
                                        block_size=128)),
    ("int8 per-block 32", "int8", pair(c.quantize_int8_per_block, c.dequantize_int8_per_block,
                                       block_size=32)),
    ("int8 group 128 asym (DeepSpeed)", "int8", deepspeed(8, False, 128)),
    ("uint8 zero-point 128", "int8", zero_point(8, 128)),
    ("fp8 per-tensor", "fp8", pair(c.quantize_fp8_per_tensor, c.dequantize_fp8_per_tensor)),
    ("fp8 per-row", "fp8", pair(c.quantize_fp8_per_row, c.dequantize_fp8_per_row)),
    ("fp8 per-token-group 128", "fp8", pair(c.quantize_fp8_per_token_group,
                                            c.dequantize_fp8_per_token_group, group_size=128)),
    ("fp8 per-token-group 128 ue8m0", "fp8", pair(c.quantize_fp8_per_token_group,
                                                  c.dequantize_fp8_per_token_group, group_size=128,
                                                  quantize_only={"scale_format": "ue8m0"})),
    ("fp8 per-block 128x128", "fp8", pair(c.quantize_fp8_per_block, c.dequantize_fp8_per_block)),
    ("int4 group 128 sym (DeepSpeed)", "int4", deepspeed(4, True, 128)),
    ("int4 group 128 asym", "int4", int4_asym(128)),
    ("int4 group 32 asym", "int4", int4_asym(32)),
    ("uint4 zero-point 128", "int4", zero_point(4, 128)),
    ("uint4 zero-point 128 stochastic", "int4", zero_point(4, 128, rounding="stochastic", seed=7)),
]


def sqnr_db(ref, approx):
    ref = ref.astype(np.float64)
    noise = np.sum((ref - approx.astype(np.float64)) ** 2)
    return np.inf if noise == 0 else 10 * np.log10(np.sum(ref**2) / noise)


R = {}  # name -> dict of results
t0 = time.perf_counter()
for name, family, run in FORMATS:
    stored, approx = run(W)
    err = approx - x
    R[name] = dict(family=family, stored=stored, err=err,
                   bits=8 * sum(a.nbytes for a in stored) / W.size,
                   sqnr=sqnr_db(x, approx), max_err=float(np.abs(err).max()),
                   rel_rms=float(np.sqrt(np.mean(err.astype(np.float64) ** 2) / np.mean(x.astype(np.float64) ** 2))))
print(f"{len(FORMATS)} formats in {time.perf_counter() - t0:.1f} s\\n")
print(f"{'format':33s} {'bits/weight':>11s} {'SQNR dB':>8s} {'max |err|':>10s} {'rms err / rms w':>15s}")
for name, r in R.items():
    print(f"{name:33s} {r['bits']:11.3f} {r['sqnr']:8.2f} {r['max_err']:10.3e} {r['rel_rms']:15.2e}")
'''),
    md("""
    ## Error histograms

    The distribution of `w_hat - w` over all the weights, on a log scale because the tails
    matter; each panel's x range covers 99.99% of its errors. An integer format with one
    scale for values of very different sizes has a broad, flat error (uniform over one
    step, the same step for small and large weights); finer scales narrow it. FP8's error
    grows with each weight's magnitude, so it is sharply peaked at zero with tails from the
    largest weights. The 4-bit formats have a panel of their own: compare the x axes.
    """),
    code('''
def error_histograms(ax, names, title):
    span = max(np.quantile(np.abs(R[n]["err"]), 0.9999) for n in names)
    bins = np.linspace(-span, span, 201)
    for n in names:
        ax.hist(R[n]["err"].ravel(), bins=bins, histtype="step", lw=1.2, label=n)
    ax.set(yscale="log", xlabel="error  w_hat - w  (weight units)", ylabel="weights per bin",
           title=title)
    ax.legend(fontsize=8)


fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.5))
error_histograms(ax1, ["int8 per-tensor", "int8 per-channel", "int8 per-block 128",
                       "fp8 per-tensor", "fp8 per-block 128x128"], "8-bit formats")
error_histograms(ax2, ["int4 group 128 sym (DeepSpeed)", "int4 group 128 asym",
                       "int4 group 32 asym", "uint4 zero-point 128",
                       "uint4 zero-point 128 stochastic"], "4-bit formats")
fig.suptitle(f"Quantization error of a {N}x{K} bfloat16 weight (dequantized to float32)")
fig.tight_layout()
plt.show()
'''),
    md("""
    ## Accuracy against storage

    Left: SQNR of each format (higher is better; 6 dB is about one bit). Right: the same
    against the bits each weight costs, scales included: formats toward the top left give
    more accuracy for their size. Look for how far finer granularity lifts a family (the
    vertical spread at almost the same bits per weight) compared with the jump between
    8 and 4 bits.
    """),
    code('''
COLORS = {"int8": "C0", "fp8": "C1", "int4": "C2"}
names = list(R)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [1, 1.25]})
ax1.barh(names, [R[n]["sqnr"] for n in names], color=[COLORS[R[n]["family"]] for n in names])
ax1.invert_yaxis()
for i, n in enumerate(names):
    ax1.text(R[n]["sqnr"] + 0.3, i, f"{R[n]['sqnr']:.1f}", va="center", fontsize=8)
ax1.set(xlabel="SQNR (dB)", title="SQNR by format")
ax1.grid(axis="x", alpha=0.3)

markers = "osD^vP*Xh<>"
for i, n in enumerate(names):
    ax2.scatter(R[n]["bits"], R[n]["sqnr"], color=COLORS[R[n]["family"]],
                marker=markers[i % len(markers)], s=60, label=n)
ax2.set(xlabel="bits per weight (codes + scales)", ylabel="SQNR (dB)",
        title="SQNR against storage cost")
ax2.grid(alpha=0.3)
ax2.legend(fontsize=7.5, loc="center left", bbox_to_anchor=(1.01, 0.5))
fig.tight_layout()
plt.show()
'''),
    md("""
    ## Where the error goes: rows of different scales

    SQNR of each output row against the row's largest weight. With a single scale for the
    whole tensor, int8 spends its 255 steps on the largest row: small rows get few steps and
    lose accuracy (the rising line). One scale per row flattens it. FP8 per-tensor stays much
    flatter than int8 per-tensor without any extra scales, because a floating-point grid
    follows each value's magnitude.
    """),
    code('''
def row_sqnr(name):
    err = R[name]["err"].astype(np.float64)
    return 10 * np.log10(np.sum(x.astype(np.float64) ** 2, axis=1) / np.sum(err**2, axis=1))


order = np.argsort(row_amax)
fig, ax = plt.subplots(figsize=(9, 5))
for n in ["int8 per-tensor", "int8 per-channel", "fp8 per-tensor", "fp8 per-row",
          "int4 group 128 asym"]:
    ax.plot(row_amax[order], row_sqnr(n)[order], ".", ms=2.5, label=n)
ax.set(xscale="log", xlabel="max |w| of the row (log)", ylabel="SQNR of the row (dB)",
       title="Per-row accuracy against row scale")
ax.legend(markerscale=5)
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
'''),
    md("""
    ## Block scales: a heat map

    `quantize_fp8_per_block` stores one scale per 128x128 tile (here a 16x32 grid). The
    first map shows what the scales capture: column blocks holding an outlier channel stand
    out as bright stripes, since each of their tiles must cover the outlier, and the
    row-scale spread shows as horizontal texture.

    The other three maps share one colour scale: the SQNR of each tile after quantization,
    dark where the tile loses most. With int8 per-channel, an outlier channel sets the scale
    of every row, so the tiles *without* outliers are the ones that suffer. int8 per-block
    scales (1x128 along K) keep each outlier inside its own block. FP8's tiles come out
    nearly uniform: a float grid keeps the same relative precision under a large scale as
    under a small one.
    """),
    code('''
scales = R["fp8 per-block 128x128"]["stored"][1]
outlier_blocks = sorted(set((outlier_cols // 128).tolist()))
print(f"block scales {scales.shape}, from {scales.min():.2e} to {scales.max():.2e} "
      f"({scales.max() / scales.min():.0f}x)")
print(f"column blocks holding an outlier channel: {outlier_blocks}")


def tile_sqnr(name):
    err = R[name]["err"].astype(np.float64).reshape(N // 128, 128, K // 128, 128)
    sig = x.astype(np.float64).reshape(N // 128, 128, K // 128, 128)
    return 10 * np.log10((sig**2).sum(axis=(1, 3)) / (err**2).sum(axis=(1, 3)))


compared = ["int8 per-channel", "int8 per-block 128", "fp8 per-block 128x128"]
maps = {name: tile_sqnr(name) for name in compared}
low = min(m.min() for m in maps.values())
high = max(m.max() for m in maps.values())

fig, axes = plt.subplots(2, 2, figsize=(15, 8.5))
im = axes[0, 0].imshow(scales, norm=LogNorm(), cmap="viridis", aspect="auto",
                       interpolation="nearest")
fig.colorbar(im, ax=axes[0, 0], label="scale = max|tile| / 448 (log)")
axes[0, 0].set_title("fp8 per-block 128x128: the tile scales")
for ax, name in zip(axes.flat[1:], compared):
    im = ax.imshow(maps[name], cmap="magma", vmin=low, vmax=high, aspect="auto",
                   interpolation="nearest")
    fig.colorbar(im, ax=ax, label="SQNR of the tile (dB)")
    ax.set_title(f"{name}: SQNR of each 128x128 tile")
for ax in axes.flat:
    ax.set(xlabel="column block (128 input channels each)", ylabel="row block (128 rows each)")
fig.tight_layout()
plt.show()
for name in compared:
    print(f"{name:24s} tile SQNR from {maps[name].min():5.1f} to {maps[name].max():5.1f} dB")
'''),
    md("""
    ## Which format when

    The numbers below are computed from the table above; the notes after them say what to
    look for.
    """),
    code('''
def s(name):
    return R[name]["sqnr"]


def b(name):
    return R[name]["bits"]


facts = [
    ("int8: per-channel over per-tensor", s("int8 per-channel") - s("int8 per-tensor"), "dB"),
    ("int8: smoothing before per-channel", s("int8 smoothed + per-channel") - s("int8 per-channel"), "dB"),
    ("int8: per-block 128 over per-channel", s("int8 per-block 128") - s("int8 per-channel"), "dB"),
    ("int8 per-block 128: extra bits per weight over per-channel",
     b("int8 per-block 128") - b("int8 per-channel"), "bits"),
    ("fp8 per-tensor over int8 per-tensor", s("fp8 per-tensor") - s("int8 per-tensor"), "dB"),
    ("fp8: per-block 128x128 over per-tensor", s("fp8 per-block 128x128") - s("fp8 per-tensor"), "dB"),
    ("fp8 per-token-group: cost of ue8m0 (power-of-two) scales",
     s("fp8 per-token-group 128") - s("fp8 per-token-group 128 ue8m0"), "dB"),
    ("int8 per-channel over fp8 per-block 128x128",
     s("int8 per-channel") - s("fp8 per-block 128x128"), "dB"),
    ("8 bits (int8 per-block 128) over 4 bits (int4 group 128 asym)",
     s("int8 per-block 128") - s("int4 group 128 asym"), "dB"),
    ("int4: group 32 over group 128", s("int4 group 32 asym") - s("int4 group 128 asym"), "dB"),
    ("int4: group 32 extra bits per weight", b("int4 group 32 asym") - b("int4 group 128 asym"), "bits"),
    ("uint4 zero-point over DeepSpeed int4 asym (group 128)",
     s("uint4 zero-point 128") - s("int4 group 128 asym"), "dB"),
    ("uint4 zero-point: bits per weight saved by bf16 scales and zeros",
     b("int4 group 128 asym") - b("uint4 zero-point 128"), "bits"),
    ("uint4: cost of stochastic rounding", s("uint4 zero-point 128") - s("uint4 zero-point 128 stochastic"), "dB"),
]
for text, value, unit in facts:
    print(f"{text:62s} {value:+7.2f} {unit}")
'''),
    md("""
    * **int8 per-tensor**: one scale for everything. Right only when the values share one
      range, such as activations with a calibrated static scale (`scale=` skips the amax
      pass). On weights whose rows differ, the per-row plot shows the small rows losing.
    * **int8 per-channel**: the usual W8A8 weight format; one float32 per row is free in
      storage. Compare it with per-tensor in the first line above. Outlier input channels
      still inflate every row's scale: that is what **smoothing** (SmoothQuant) and
      **per-block 128** scales address, and the lines above show how much each recovers.
    * **fp8 per-tensor / per-row**: a float grid keeps relative precision at every magnitude,
      so one scale already tolerates the row spread (compare fp8 and int8 per-tensor). On
      Hopper-class GPUs FP8 GEMMs consume it directly; per-row suits activations.
    * **fp8 per-token-group 128**: activations for DeepSeek-V3-style block-scaled GEMMs.
      `ue8m0` (power-of-two) scales are what DeepGEMM wants on Blackwell-class GPUs, as in
      the MX formats; their cost is the rounding of each scale up to a power of two, printed
      above.
    * **fp8 per-block 128x128**: DeepSeek-V3's weight format, loaded by vLLM, SGLang and
      transformers, at almost no storage cost; the heat maps show how its tiles localize
      outliers. Whether int8 per-channel or fp8 per-block scores higher depends on the
      weight (the sign of the "int8 per-channel over fp8 per-block" line): int8's even steps
      are finer near the top of each scale, FP8 keeps small values precise, so outlier
      channels that inflate int8's row scales favour FP8 (try the quickstart's matrix, which
      has none). The hardware path you will run on usually decides.
    * **4-bit groups**: half the memory of 8 bits, at the cost of the 8-to-4-bit line above.
      Smaller groups buy back accuracy for extra bits per weight (see the group 32 lines).
      The zero-point (lmdeploy) layout stores scales and zeros in bfloat16, cheaper than
      DeepSpeed's float32 pairs. DeepSpeed's symmetric variant stores one number per group
      instead of two, but spreads its 16 levels over `[-max|x|, max|x|]` rather than over the
      group's actual range: compare its SQNR with the asymmetric line.
    * **stochastic rounding**: higher error per weight, but unbiased on average: for training
      and for accumulating quantized updates, not for inference weights.
    """),
]


# ---------------------------------------------------------------------------------------
# 03: interop

INTEROP = [
    md("""
    # NumPy, CuPy, PyTorch and JAX: arrays in and out

    cuquant takes arrays from any of these frameworks (or any object that speaks DLPack) and
    returns results in the caller's own framework, on the caller's device. This notebook
    shows each one, the FP8 dtype it uses, and where the exchange is zero-copy.

    Cells that need a GPU, PyTorch or JAX check for them and print what they skipped when
    the requirement is absent; the notebook always runs to the end.
    """),
    code(SETUP),
    code(GPU_CHECK + '''

import ml_dtypes
import numpy as np

cp, gpu_line = find_gpu()
HAVE_GPU = cp is not None

try:
    import torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
HAVE_TORCH_CUDA = HAVE_TORCH and torch.cuda.is_available()

try:
    import jax
    import jax.numpy as jnp
    HAVE_JAX = True
except ImportError:
    HAVE_JAX = False
JAX_GPUS = [d for d in jax.devices() if d.platform in ("gpu", "cuda")] if HAVE_JAX else []

print("GPU (CuPy):  ", gpu_line)
print("PyTorch:     ", f"{torch.__version__}, CUDA {'available' if HAVE_TORCH_CUDA else 'not available'}"
      if HAVE_TORCH else "not installed: the PyTorch cells will skip")
print("JAX:         ", f"{jax.__version__}, devices {[str(d) for d in jax.devices()]}"
      if HAVE_JAX else "not installed: the JAX cells will skip")

rng = np.random.default_rng(0)
x_np = (rng.standard_normal((256, 1024), dtype=np.float32) * 0.05).astype(ml_dtypes.bfloat16)
q_ref, s_ref = cuquant.quantize_fp8_per_token_group(x_np, group_size=128)  # the NumPy reference


def same_bits(a, b):
    """Equal bytes, whatever the framework and dtype (float8 and bfloat16 included)."""
    def host_bytes(t):
        if HAVE_TORCH and isinstance(t, torch.Tensor):
            return t.detach().cpu().contiguous().view(torch.uint8).numpy().ravel()
        if HAVE_GPU and isinstance(t, cp.ndarray):
            t = cp.asnumpy(t)
        t = np.asarray(t)
        return np.ascontiguousarray(t).view(np.uint8).ravel()
    return np.array_equal(host_bytes(a), host_bytes(b))
'''),
    md("""
    ## FP8 and bfloat16 in each framework

    | framework | fp8 codes | bfloat16 |
    |---|---|---|
    | NumPy | `ml_dtypes.float8_e4m3fn` | `ml_dtypes.bfloat16` |
    | CuPy | `uint8` (the raw bytes: CuPy has no float8 dtype) | `ml_dtypes.bfloat16` |
    | PyTorch | `torch.float8_e4m3fn` | `torch.bfloat16` |
    | JAX | `jnp.float8_e4m3fn` | `jnp.bfloat16` |

    Dequantizers accept the codes in any of these forms (including CuPy's `uint8`), and the
    output `dtype` as a NumPy/ml_dtypes, torch or JAX dtype, or a name such as `"bfloat16"`.
    """),
    md("""
    ## NumPy

    Host arrays run the NumPy backend. FP8 codes are `ml_dtypes.float8_e4m3fn`, which
    converts and prints like any NumPy float; `.view(np.uint8)` shows the raw bytes without
    copying.
    """),
    code('''
q, s = cuquant.quantize_fp8_per_token_group(x_np, group_size=128)
print(type(q).__name__, q.dtype, q.shape, "| scales", s.dtype, s.shape)
print("codes", q[0, :4], "bytes", q[0, :4].view(np.uint8))
raw = q.view(np.uint8)
print("the uint8 view shares memory with the codes:", np.shares_memory(raw, q))
y = cuquant.dequantize_fp8_per_token_group(raw, s, "bfloat16", group_size=128)  # uint8 codes accepted
print("dequantized from the uint8 view:", y.dtype, y.shape)
'''),
    md("""
    ## Any DLPack array

    Objects that are neither NumPy nor a known framework are taken through DLPack (or the
    array protocol). A host DLPack array is read without copying and its results come back
    as NumPy arrays.
    """),
    code('''
class OnlyDLPack:
    """Exposes nothing but the DLPack protocol, as a foreign array library would."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


x32 = x_np.astype(np.float32)
view = np.from_dlpack(OnlyDLPack(x32))
print("np.from_dlpack reads the same memory:", view.ctypes.data == x32.ctypes.data)
q_d, s_d = cuquant.quantize_fp8_per_token_group(OnlyDLPack(x32), group_size=128)
print(type(q_d).__name__, q_d.dtype, "| same bits as from the NumPy array itself:",
      same_bits(q_d, cuquant.quantize_fp8_per_token_group(x32, group_size=128)[0]))
'''),
    md("""
    ## CuPy (needs a CUDA GPU)

    CuPy arrays run the CUDA kernels on the array's device and the current CuPy stream
    (or the `stream=` you pass). FP8 codes come back as `uint8`: view them as
    `float8_e4m3fn` after moving them to the host. The bits equal the NumPy backend's.
    """),
    code('''
if HAVE_GPU:
    x_cp = cp.asarray(x_np)
    q_cp, s_cp = cuquant.quantize_fp8_per_token_group(x_cp, group_size=128)
    print(type(q_cp).__name__, q_cp.dtype, "on device", q_cp.device.id, "| scales", s_cp.dtype)
    print("same bits as NumPy:", same_bits(q_cp, q_ref), same_bits(s_cp, s_ref))
    print("codes on the host:", q_cp[0, :4].get().view(ml_dtypes.float8_e4m3fn))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        y_cp = cuquant.dequantize_fp8_per_token_group(q_cp, s_cp, "bfloat16", group_size=128)
    stream.synchronize()
    print("dequantized on a side stream:", y_cp.dtype, y_cp.shape)
else:
    print("Skipped (needs a CUDA GPU with CuPy):", gpu_line)
'''),
    md("""
    ## PyTorch

    Tensors in, tensors out, on the same device. CPU tensors run the NumPy backend with no
    copy in either direction (the backend reads the tensor's memory through `.numpy()`, and
    results are wrapped with `torch.from_numpy`). CUDA tensors run the kernels and results
    are handed to torch through DLPack, zero-copy, with `torch.float8_e4m3fn` codes.
    `stream=` takes a `torch.cuda.Stream`.
    """),
    code('''
if HAVE_TORCH:
    x_t = torch.from_numpy(x_np.view(np.int16)).view(torch.bfloat16)  # bfloat16 tensor, shares x_np's memory
    print("torch tensor shares the NumPy array's memory:", x_t.data_ptr() == x_np.ctypes.data)
    q_t, s_t = cuquant.quantize_fp8_per_token_group(x_t, group_size=128)
    print(type(q_t).__name__, q_t.dtype, q_t.device, "| scales", s_t.dtype)
    print("same bits as NumPy:", same_bits(q_t, q_ref), same_bits(s_t, s_ref))
    y_t = cuquant.dequantize_fp8_per_token_group(q_t, s_t, torch.bfloat16, group_size=128)
    print("dequantized:", y_t.dtype, tuple(y_t.shape), "| torch reads fp8 itself:",
          torch.equal(q_t.float(), torch.from_numpy(q_ref.astype(np.float32))))
    shared = np.from_dlpack(s_t)
    print("np.from_dlpack(tensor) is zero-copy:", shared.ctypes.data == s_t.data_ptr())
else:
    print("Skipped: PyTorch is not installed (pip install torch).")
'''),
    code('''
if HAVE_TORCH_CUDA and HAVE_GPU:
    x_tc = x_t.cuda()
    q_tc, s_tc = cuquant.quantize_fp8_per_token_group(x_tc, group_size=128,
                                                      stream=torch.cuda.current_stream())
    print(q_tc.dtype, q_tc.device, "| scales", s_tc.dtype, s_tc.device)
    print("same bits as NumPy:", same_bits(q_tc, q_ref), same_bits(s_tc, s_ref))
    as_cupy = cp.from_dlpack(q_tc.view(torch.uint8))
    print("CuPy view of the torch codes is zero-copy:", as_cupy.data.ptr == q_tc.data_ptr())
    w_tc = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    q_w, s_w = cuquant.quantize_fp8_per_block(w_tc)
    y_w = cuquant.dequantize_fp8_per_block(q_w, s_w, torch.bfloat16)
    print("fp8 per-block round trip on the GPU, max |error|:", (y_w - w_tc).abs().max().item())
elif HAVE_TORCH:
    print("Skipped: PyTorch has no CUDA device here (or CuPy is missing):", gpu_line)
else:
    print("Skipped: PyTorch is not installed.")
'''),
    md("""
    ## JAX

    `jax.Array`s in, `jax.Array`s out, on the array's device, with FP8 codes as
    `jnp.float8_e4m3fn`. On a GPU, float16 and float32 inputs are read in place through
    DLPack; bfloat16 and FP8 cross DLPack as integers of the same width, through a bitcast
    that XLA performs as a new array, and results are handed back to JAX through DLPack the
    same way. On the CPU the NumPy backend runs and results are placed with
    `jax.device_put`, which copies. A JAX array must live on one device (pass one shard of a
    sharded array). The first cell pins its input to the CPU, so it runs the NumPy backend
    even where JAX's default device is a GPU.
    """),
    code('''
if HAVE_JAX:
    x_j = jax.device_put(x_np, jax.devices("cpu")[0])  # jnp.bfloat16 is ml_dtypes.bfloat16
    q_j, s_j = cuquant.quantize_fp8_per_token_group(x_j, group_size=128)
    print(type(q_j).__name__, q_j.dtype, "on", list(q_j.devices()), "| scales", s_j.dtype)
    print("fp8 dtype is jnp.float8_e4m3fn:", q_j.dtype == jnp.float8_e4m3fn)
    print("same bits as NumPy:", same_bits(q_j, q_ref), same_bits(s_j, s_ref))
    y_j = cuquant.dequantize_fp8_per_token_group(q_j, s_j, jnp.bfloat16, group_size=128)
    print("dequantized:", y_j.dtype, y_j.shape, "on", list(y_j.devices()), "| max |error|",
          float(jnp.abs(y_j.astype(jnp.float32) - x_j.astype(jnp.float32)).max()))
else:
    print("Skipped: JAX is not installed (pip install jax).")
'''),
    code('''
if HAVE_JAX and JAX_GPUS and HAVE_GPU:
    x_jg = jax.device_put(jnp.asarray(x_np), JAX_GPUS[0])
    q_jg, s_jg = cuquant.quantize_fp8_per_token_group(x_jg, group_size=128)
    print(q_jg.dtype, "on", list(q_jg.devices()))
    print("same bits as NumPy:", same_bits(q_jg, q_ref), same_bits(s_jg, s_ref))
    s_cp_view = cp.from_dlpack(s_jg)
    print("CuPy view of the JAX scales is zero-copy:",
          s_cp_view.data.ptr == s_jg.unsafe_buffer_pointer())
elif HAVE_JAX:
    print("Skipped: JAX sees no GPU here (a CUDA build of jaxlib and CuPy are needed).")
else:
    print("Skipped: JAX is not installed.")
'''),
    md("""
    ## Mixing frameworks in one call

    All arrays of one call must live in one place (all on the host, or all on one device);
    the results take the family of the first array argument. Codes from one framework can be
    dequantized from another after a DLPack hand-over, for example torch codes read by NumPy.
    """),
    code('''
if HAVE_TORCH:
    codes_np = q_t.view(torch.uint8).numpy()  # zero-copy view of torch's fp8 codes as bytes
    y_mixed = cuquant.dequantize_fp8_per_token_group(codes_np, s_t.numpy(), np.float32, group_size=128)
    print(type(y_mixed).__name__, y_mixed.dtype, "| equals the torch result:",
          np.array_equal(y_mixed.astype(ml_dtypes.bfloat16).view(np.uint16),
                         y_t.view(torch.int16).numpy().view(np.uint16)))
else:
    print("Skipped: PyTorch is not installed.")
'''),
]


# ---------------------------------------------------------------------------------------
# 04: performance

PERFORMANCE = [
    md("""
    # Performance on the GPU

    The benchmark (`python -m benchmarks`, or `bash benchmarks/run_gpu.sh` on a CUDA
    machine) times every kernel with a cold L2 cache and writes a CSV to
    `benchmarks/results/`. This notebook plots the newest one; it needs no GPU.

    * **effective bandwidth** (`tbps`, TB/s): bytes of every input read once plus every
      output written once, over the kernel time. Quantization and dequantization do little
      arithmetic per byte, so memory bandwidth bounds them.
    * **fraction of copy** (`frac_copy`): that bandwidth over the device-to-device copy
      bandwidth measured in the same run, the practical ceiling.
    * **baselines** (`eager_frac`, `compile_frac`, `cupy_frac`): the same fraction for the
      plain torch eager expression, the same under `torch.compile` (largest shape only), and
      a naive CuPy expression, counted at the logical bytes.
    * **target**: the fraction of copy the kernel aims for at the largest shape.

    Set `CUQUANT_BENCH_RESULTS` to a folder to plot results from elsewhere.
    """),
    code('''
import csv
import json
import os
import pathlib
import re

import matplotlib.pyplot as plt
import numpy as np

NUMERIC = ("us", "bytes", "logical_bytes", "tbps", "frac_copy", "target", "host_us",
           "eager_frac", "compile_frac", "cupy_frac")


def results_dirs():
    """$CUQUANT_BENCH_RESULTS, else benchmarks/results in this folder or a parent."""
    if os.environ.get("CUQUANT_BENCH_RESULTS"):
        return [pathlib.Path(os.environ["CUQUANT_BENCH_RESULTS"])]
    here = pathlib.Path.cwd().resolve()
    return [p / "benchmarks" / "results" for p in (here, *here.parents)]


def newest_csv():
    """The newest results file: dated names (YYYY-MM-DD-...) by date, then by time modified."""
    def key(p):
        m = re.match(r"\\d{4}-\\d{2}-\\d{2}", p.name)
        return (m.group(0) if m else "", p.stat().st_mtime)
    for folder in results_dirs():
        files = sorted(folder.glob("*.csv"), key=key) if folder.is_dir() else []
        if files:
            return files[-1]
    return None


def load(path):
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {k: (v or "") for k, v in raw.items() if k}
            for k in NUMERIC:
                v = row.get(k, "")
                row[k] = float(v) if v not in ("", None) else np.nan
            row["label"] = row["op"] + variant_text(row.get("variant", ""))
            rows.append(row)
    return rows


def variant_text(v):
    if not v:
        return ""
    try:
        return " " + " ".join(f"{k}={val}" for k, val in json.loads(v).items())
    except (ValueError, AttributeError):
        return f" {v}"


path = newest_csv()
everything = load(path) if path else []
rows = [r for r in everything if not r.get("error")]
failed = [r for r in everything if r.get("error")]
if path is None:
    print("No benchmark results found (looked in: "
          + ", ".join(str(d) for d in results_dirs()[:2]) + ", ...).")
    print("Run `bash benchmarks/run_gpu.sh` on a CUDA machine, then run this notebook again; "
          "the cells below will skip.")
else:
    print(f"results: {path}")
    print(f"{len(rows)} measurements of {len({r['label'] for r in rows})} kernels, "
          f"{len(failed)} failed")
'''),
    md("""
    The copy bandwidth is not a column of its own: every row's `tbps / frac_copy` gives it
    back (they were measured against the same copy).
    """),
    code('''
if rows:
    ratios = [r["tbps"] / r["frac_copy"] for r in rows if r["frac_copy"] > 0]
    COPY_TBPS = float(np.median(ratios)) if ratios else float("nan")
    print(f"device copy bandwidth: {COPY_TBPS:.3f} TB/s (read + write)")
    shapes = sorted({r["shape"] for r in rows}, key=lambda s: np.prod([int(d) for d in s.split("x")]))
    print("shapes:", ", ".join(shapes), "| dtypes:", ", ".join(sorted({r["dtype"] for r in rows})))
else:
    print("Skipped: no results.")
'''),
    md("""
    ## Effective bandwidth against size

    One line per kernel, split into quantization and dequantization, on log-log axes. Small
    shapes are bound by launch latency (a few microseconds), so their bandwidth grows in
    proportion to size whatever the kernel; look at how close each line gets to the dashed
    copy line at the largest sizes.
    """),
    code('''
def by_label(selected):
    out = {}
    for r in selected:
        out.setdefault(r["label"], []).append(r)
    return {k: sorted(v, key=lambda r: r["bytes"]) for k, v in sorted(out.items())}


if rows:
    fig, axes = plt.subplots(1, 2, figsize=(16, 6.5), sharey=True)
    for ax, kind in zip(axes, ("quantize", "dequantize")):
        groups = by_label(r for r in rows if r["op"].startswith("de") == (kind == "dequantize"))
        for i, (label, rs) in enumerate(groups.items()):
            ax.plot([r["bytes"] / 1e6 for r in rs], [r["tbps"] for r in rs], ms=4,
                    color=plt.get_cmap("tab10")(i % 10), ls=("-", "-.", ":")[i // 10 % 3],
                    marker="osD^v"[i // 10 % 5], label=label)
        ax.axhline(COPY_TBPS, color="black", ls="--", label=f"device copy ({COPY_TBPS:.2f} TB/s)")
        ax.set(xscale="log", yscale="log", xlabel="bytes moved per call (MB, log)",
               title=f"{kind.capitalize()} kernels: effective bandwidth vs size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("effective bandwidth (TB/s, log)")
    fig.tight_layout()
    plt.show()
else:
    print("Skipped: no results.")
'''),
    md("""
    ## Against the baselines, kernel by kernel

    Each panel is one kernel: cuquant's bandwidth against size beside the torch eager
    expression, `torch.compile` (largest shape only) and a naive CuPy expression, all in
    TB/s (the baselines' fractions of copy times the copy bandwidth). A missing line or marker
    means that baseline was not measured for that kernel or size.
    """),
    code('''
BASELINES = (("eager_frac", "torch eager", "s", "C1"), ("compile_frac", "torch.compile", "*", "C2"),
             ("cupy_frac", "naive CuPy", "^", "C3"))

if rows:
    groups = by_label(rows)
    cols = 4
    nrows = -(-len(groups) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, (label, rs) in zip(axes.flat, groups.items()):
        mb = np.array([r["bytes"] / 1e6 for r in rs])
        ax.plot(mb, [r["tbps"] for r in rs], "o-", color="C0", label="cuquant")
        for col, name, marker, color in BASELINES:
            ys = np.array([r[col] * COPY_TBPS for r in rs])
            if np.isfinite(ys).any():
                ax.plot(mb, ys, marker=marker, ls=":", color=color, label=name)
        ax.axhline(COPY_TBPS, color="black", ls="--", lw=1, label="device copy")
        ax.set_xscale("log")
        ax.set_title(label, fontsize=8.5)
        ax.set_xlabel("bytes moved (MB, log)", fontsize=8)
        ax.set_ylabel("TB/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    handles, names = [], []
    for ax in axes.flat:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=9,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle("Effective bandwidth vs size, cuquant against the baselines", y=1.03)
    fig.tight_layout()
    plt.show()
else:
    print("Skipped: no results.")
'''),
    md("""
    ## The largest shape against the target

    At the largest shape every kernel is bandwidth bound. Bars show each kernel's fraction
    of the copy bandwidth beside the baselines; the black tick is the kernel's target.
    The table below lists the same numbers and whether the target is met.
    """),
    code('''
if rows:
    head = {}
    for r in rows:
        if r["label"] not in head or r["bytes"] > head[r["label"]]["bytes"]:
            head[r["label"]] = r
    labels = sorted(head)
    y = np.arange(len(labels))
    series = [("frac_copy", "cuquant", "C0")] + [
        (col, name, color) for col, name, _, color in BASELINES
        if any(np.isfinite(head[lab][col]) for lab in labels)]  # baselines that were measured
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(labels) + 1.5))
    for i, (col, name, color) in enumerate(series):
        vals = np.array([head[lab][col] for lab in labels])
        ax.barh(y + (i - (len(series) - 1) / 2) * height, np.nan_to_num(vals), height,
                color=color, label=name)
    targets = np.array([head[lab]["target"] for lab in labels])
    ax.scatter(targets, y, marker="|", s=300, color="black", label="target", zorder=3)
    ax.axvline(1.0, color="black", ls="--", lw=1, label="device copy")
    ax.set_yticks(y, [f"{lab}  ({head[lab]['shape']})" for lab in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="fraction of device copy bandwidth", title="Largest shape: cuquant, baselines and target")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    plt.show()

    width = max(len(lab) for lab in labels)
    print(f"{'kernel':{width}s} {'shape':>11s} {'us':>8s} {'TB/s':>6s} {'x copy':>7s} {'target':>7s}  met")
    for lab in labels:
        r = head[lab]
        met = "-" if not np.isfinite(r["target"]) else "yes" if r["frac_copy"] >= r["target"] else "NO"
        print(f"{lab:{width}s} {r['shape']:>11s} {r['us']:8.1f} {r['tbps']:6.2f} "
              f"{r['frac_copy']:7.3f} {r['target']:7.2f}  {met}")
    with_target = [lab for lab in labels if np.isfinite(head[lab]["target"])]
    met_count = sum(head[lab]["frac_copy"] >= head[lab]["target"] for lab in with_target)
    print(f"\\n{met_count} of {len(with_target)} kernels with a target meet it at the largest shape")
else:
    print("Skipped: no results.")
'''),
    md("""
    ## Host overhead

    `host_us` is the host time of one call on a small shape: the wall clock spent inside
    the call with the GPU idle (argument checks, dispatch, output allocation and launch).
    It bounds how fast tiny tensors can go, whatever the kernel.
    """),
    code('''
if rows:
    host = {}
    for r in rows:
        if np.isfinite(r["host_us"]):
            host.setdefault(r["label"], []).append(r["host_us"])
    if host:
        labels = sorted(host, key=lambda lab: np.median(host[lab]))
        fig, ax = plt.subplots(figsize=(10, 0.32 * len(labels) + 1.5))
        ax.barh(labels, [np.median(host[lab]) for lab in labels], color="C2")
        ax.set(xlabel="host time per call (microseconds, median over small shapes)",
               title="Python-side overhead per call")
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        plt.show()
    else:
        print("These results have no host timings.")
else:
    print("Skipped: no results.")
'''),
    code('''
if failed:
    print("Kernels whose benchmark failed:")
    for r in failed:
        print(f"  {r['label']} {r['shape']}: {r['error']}")
elif rows:
    print("No benchmark errors in this file.")
else:
    print("Skipped: no results.")
'''),
]


NOTEBOOKS = {
    "01-quickstart.ipynb": QUICKSTART,
    "02-formats-and-error.ipynb": FORMATS_AND_ERROR,
    "03-interop.ipynb": INTEROP,
    "04-performance.ipynb": PERFORMANCE,
}


def build(name: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    stem = name.split("-")[0]
    cells = []
    for i, cell in enumerate(NOTEBOOKS[name]):
        cell = nbformat.from_dict(dict(cell))
        cell["id"] = f"nb{stem}-{i:02d}"
        cells.append(cell)
    nb.cells = cells
    nbformat.validate(nb)
    return nb


def text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name in NOTEBOOKS:
        path = HERE / name
        want = text(build(name))
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != want:
                stale.append(name)
        else:
            path.write_text(want, encoding="utf-8")
    if stale:
        print("out of date (run python notebooks/_build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
