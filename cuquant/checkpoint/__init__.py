"""Quantize and dequantize whole model checkpoints (safetensors), one tensor at a time.

`quantize_checkpoint` reads a checkpoint (one ``.safetensors`` file, a directory of shards,
or a ``*.safetensors.index.json``), quantizes its 2-D weight matrices with the library's
operators and writes shards plus an index; `dequantize_checkpoint` undoes it;
`inspect_checkpoint` lists what a checkpoint holds. Tensors stream through in bands of
rows, so host memory stays near one band, never one model. The output is written under a
temporary name beside its final one and renamed only when complete.

The command writes the formats inference engines load (`COMMAND_FORMATS`): the
compressed-tensors schemes (NVFP4 and MXFP4 among them, `FP4_FORMATS`) and AWQ of
`ENGINE_FORMATS` (cuquant/checkpoint/engines.py), and DeepSeek-V3's fp8-block. `FORMATS`
holds cuquant's own layouts: fp8-block, and the formats no engine loads (int8-channel,
int4-group, fp8-row), which Python callers may still write (``quant_method: "cuquant"``)
and which `dequantize_checkpoint` and `inspect_checkpoint` still read. Each entry of
`FORMATS` names the library functions that quantize and dequantize it, and the tensors it
writes for a weight ``W``: the codes under the weight's own name, and one float32 companion
(the scale, or DeepSpeed's params) under ``W + suffix``.

`dequantize_checkpoint` and `inspect_checkpoint` also read compressed-tensors and AWQ
checkpoints made by other tools (llm-compressor, AutoAWQ), from config.json's
``quantization_config``."""

from __future__ import annotations

from .backend import (
    Backend,
    gpu_available,
    select_backend,
)
from .dequantize import dequantize_checkpoint
from .engines import (
    AWQ_ORDER,
    ENGINE_FORMATS,
    EngineFormat,
    FP4_FORMATS,
    FP4Format,
)
from .formats import (
    ceil_pow2,
    CheckpointError,
    COMMAND_FORMATS,
    CPU_CHUNK,
    DEFAULT_SKIP,
    FLOAT_DTYPES,
    Format,
    FORMATS,
    GPU_CHUNK,
    human_bytes,
    LEGACY_FORMATS,
    parse_size,
    SCALE_FORMATS,
)
from .inspect import inspect_checkpoint
from .quantize import quantize_checkpoint
from .read import (
    Checkpoint,
    HALF_SCALES,
    open_checkpoint,
    recognise,
)
from .report import (
    Report,
    TensorRecord,
)
# The safetensors reader and writer are re-exported here: they read F8_E4M3 tensors as
# ml_dtypes.float8_e4m3fn arrays, which the safetensors package's NumPy API cannot.
from .safetensors import (
    load_file,
    SafetensorsError,
    SafetensorsFile,
    save_file,
)

__all__ = [
    "AWQ_ORDER",
    "COMMAND_FORMATS",
    "DEFAULT_SKIP",
    "ENGINE_FORMATS",
    "EngineFormat",
    "FORMATS",
    "FP4_FORMATS",
    "FP4Format",
    "SCALE_FORMATS",
    "Backend",
    "Checkpoint",
    "CheckpointError",
    "Format",
    "Report",
    "SafetensorsError",
    "SafetensorsFile",
    "TensorRecord",
    "ceil_pow2",
    "dequantize_checkpoint",
    "gpu_available",
    "human_bytes",
    "inspect_checkpoint",
    "load_file",
    "open_checkpoint",
    "parse_size",
    "quantize_checkpoint",
    "recognise",
    "save_file",
    "select_backend",
]
