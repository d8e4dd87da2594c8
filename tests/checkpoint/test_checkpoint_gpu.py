"""Checkpoints on the GPU: the CuPy path writes the same bytes as the NumPy path, for every
format (UE8M0 scales, the compressed-tensors schemes, AWQ, and edge values included) and
restores the same bytes, and PyTorch's own safetensors loader reads the fp8-block output as
torch.float8_e4m3fn. Run on a CUDA machine:
`python -m pytest -m gpu tests/checkpoint/test_checkpoint_gpu.py`."""

from __future__ import annotations

import filecmp
import json

import ml_dtypes
import numpy as np
import pytest
from test_checkpoint import QUANTIZED, load_dir, make_checkpoint, raw_headers

from cuquant import checkpoint as ckpt
from cuquant.checkpoint.safetensors import SafetensorsFile, save_file

pytestmark = pytest.mark.gpu

CASES = ([(f, "float32") for f in ckpt.FORMATS] + [("fp8-block", "ue8m0")]
         + [(f, "float32") for f in ckpt.ENGINE_FORMATS])


def same_tree(a, b):
    names_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    names_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert names_a == names_b
    for rel in names_a:
        assert filecmp.cmp(a / rel, b / rel, shallow=False), f"{rel} differs"


@pytest.fixture
def model(tmp_path, rng):
    src = tmp_path / "model"
    make_checkpoint(src, rng)
    # a DeepSeek-V3-sized projection, and an edge tile of tiny values
    big = rng.standard_normal((576, 7168)).astype(np.float32) * 0.02
    big[:128, :128] *= 1e-36
    big[200, 300] = np.nan
    save_file({"model.layers.2.self_attn.kv_a_proj_with_mqa.weight": big.astype(ml_dtypes.bfloat16),
               "model.layers.2.mlp.up_proj.weight":
                   (rng.standard_normal((2048, 7168)) * 0.02).astype(ml_dtypes.bfloat16)},
              src / "extra.safetensors")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.2.self_attn.kv_a_proj_with_mqa.weight"] = "extra.safetensors"
    index["weight_map"]["model.layers.2.mlp.up_proj.weight"] = "extra.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    return src


@pytest.mark.parametrize("fmt,scale_format", CASES)
@pytest.mark.parametrize("chunk", [None, 1 << 20])
def test_gpu_writes_the_cpu_bytes(model, tmp_path, fmt, scale_format, chunk):
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    # NVFP4 and MXFP4 refuse NaN weights (tests/checkpoint/test_checkpoint_microscaling.py).
    skip = ["*kv_a_proj_with_mqa*"] if fmt in ckpt.FP4_FORMATS else []
    rc = ckpt.quantize_checkpoint(model, cpu, fmt, device="cpu", scale_format=scale_format,
                                  skip=skip)
    rg = ckpt.quantize_checkpoint(model, gpu, fmt, device="cuda", scale_format=scale_format,
                                  chunk_elements=chunk, skip=skip)
    assert rg.device == "cuda" and rc.device == "cpu"
    same_tree(cpu, gpu)
    for a, b in zip(rc.records, rg.records):
        assert (a.name, a.action) == (b.name, b.action)
        if a.action == "quantized" and a.sqnr_db is not None and np.isfinite(a.sqnr_db):
            assert b.sqnr_db == pytest.approx(a.sqnr_db, abs=1e-2)
    back_c, back_g = tmp_path / "back_cpu", tmp_path / "back_gpu"
    ckpt.dequantize_checkpoint(cpu, back_c, device="cpu")
    ckpt.dequantize_checkpoint(gpu, back_g, device="cuda", chunk_elements=chunk)
    same_tree(back_c, back_g)


def test_torch_loads_the_deepseek_layout(model, tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    out = tmp_path / "fp8"
    ckpt.quantize_checkpoint(model, out, "fp8-block", device="cuda")
    hdr = raw_headers(out)
    ours = load_dir(out)
    loaded = {}
    for shard in sorted(out.glob("*.safetensors")):
        loaded.update(st_torch.load_file(str(shard)))
    assert set(loaded) == set(hdr)
    names = QUANTIZED | {"model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
                         "model.layers.2.mlp.up_proj.weight"}
    for name in names:
        w, s = loaded[name], loaded[name + "_scale_inv"]
        n, k = w.shape
        assert w.dtype == torch.float8_e4m3fn
        assert s.dtype == torch.float32 and tuple(s.shape) == (-(-n // 128), -(-k // 128))
        assert np.array_equal(w.view(torch.uint8).numpy(), ours[name].view(np.uint8))
        back = (w.to(torch.float32) * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k])
        assert torch.isfinite(back).sum() >= back.numel() - 128 * 128  # the NaN tile aside
    kv = loaded["model.layers.2.self_attn.kv_a_proj_with_mqa.weight_scale_inv"]
    assert tuple(kv.shape) == (5, 56)
    assert loaded["model.embed_tokens.weight"].dtype == torch.bfloat16
    with SafetensorsFile(min(out.glob("*.safetensors"))) as f:
        assert f.metadata["format"] == "pt"
