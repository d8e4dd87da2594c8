"""NVFP4 and MXFP4 checkpoints load correctly in transformers, and compressed-tensors' own
read back.

A tiny Llama saved by transformers is quantized by the command in NVFP4 and MXFP4
(compressed-tensors' nvfp4-pack-quantized and mxfp4-pack-quantized, weight-only); each
output is loaded with ``AutoModelForCausalLM.from_pretrained`` (compressed-tensors
installed) and must give an empty load report, every quantized Linear's weight equal bit for
bit to ``cuquant dequantize`` of the same files and to the torch reading of the format
written below from its definition (docs/checkpoint-formats.md), not from cuquant, and
logits equal to those of a model holding that reading's weights. The codes and scales are
the library quantizers' own, and checkpoints written by compressed-tensors itself
dequantize to the weights its own decompression gives.

The CPU cases run in CI (CUQUANT_REQUIRE_ENGINES=1 makes a missing package fail); the
``cuda`` cases run the command's GPU path: ``python -m pytest -m gpu
tests/checkpoint/test_checkpoint_microscaling.py``.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from test_checkpoint_engines import (
    _require,
    assert_clean_load,
    bits_equal,
    ct_own_checkpoint,
    dequantizing,
    linear_weights,
    logits,
    model_with,
    read_all,
    tiny_llama,
)

import cuquant
from cuquant import checkpoint as ckpt
from cuquant.cli import main

torch = _require("torch")
transformers = _require("transformers")
compressed_tensors = _require("compressed_tensors")

pytestmark = pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")

SCHEMES = ("NVFP4", "MXFP4")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
BLOCK = {"NVFP4": 16, "MXFP4": 32}
# The MLP's K (intermediate size) is a multiple of 16 but not of 32: the down projections
# are NVFP4 but stay in high precision under MXFP4, listed in `ignore`.
INTERMEDIATE = 208
CT_FORMAT = {"NVFP4": "nvfp4-pack-quantized", "MXFP4": "mxfp4-pack-quantized"}
WEIGHTS = {
    "NVFP4": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
              "group_size": 16, "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"},
    "MXFP4": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group",
              "group_size": 32, "dynamic": False, "scale_dtype": "torch.uint8"},
}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory, INTERMEDIATE, zero_block=True)


# ---------------------------------------------------------------------------------------
# The formats, read from their definition

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def fp4_values(packed):
    """uint8 [N, K/2] -> float32 [N, K]: element 2i in the low nibble, 2i + 1 in the high;
    bit 3 of a code is the sign, bits 0-2 index the e2m1 grid."""
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    sign = torch.where(codes >= 8, -1.0, 1.0)
    return E2M1[codes & 7] * sign


def fp4_reference(files: dict, base: str, scheme: str, dtype=None):
    """The weight the format defines for module `base`, rounded once to `dtype` (bfloat16 by
    default): NVFP4 multiplies each code by f32(s) / global_scale (compressed-tensors'
    order), MXFP4 by 2**(b - 127)."""
    q = fp4_values(files[base + "weight_packed"])
    s = files[base + "weight_scale"]
    if scheme == "NVFP4":
        d = s.float() / files[base + "weight_global_scale"].float()
    else:
        d = torch.pow(2.0, s.double() - 127).float()        # exact in float64, then float32
    return (q * d.repeat_interleave(BLOCK[scheme], dim=1)).to(dtype or torch.bfloat16)


def library_codes(w, scheme: str):
    """(packed, scale bytes, global scale or None) of the library's quantizer for weight w."""
    x = w.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if scheme == "NVFP4":
        q, s, amax = cuquant.quantize_nvfp4(x)
        return q, np.asarray(s).view(np.uint8), np.asarray(amax, np.float32)
    q, s = cuquant.quantize_mxfp4(x, scale_mode="rceil")
    return q, np.asarray(s).view(np.uint8), None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_transformers_loads_fp4(llama, tmp_path, scheme, device):
    src, ids = llama
    out, back = tmp_path / scheme, tmp_path / "back"
    assert main(["quantize", str(src), str(out), "-f", scheme, "--device", device, "-q"]) == 0
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["quantization_status"] == "compressed"
    assert qc["format"] == CT_FORMAT[scheme]
    group = qc["config_groups"]["group_0"]
    assert group["format"] == CT_FORMAT[scheme] and group["targets"] == ["Linear"]
    assert group["weights"] == WEIGHTS[scheme] and group["input_activations"] is None
    downs = [f"model.layers.{i}.mlp.down_proj" for i in range(2)]
    assert set(qc["ignore"]) == {"lm_head", *(downs if scheme == "MXFP4" else ())}

    ckpt.dequantize_checkpoint(out, back, device=device)
    ours, files, original = read_all(back), read_all(out), read_all(src)

    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, quantization_config=dequantizing())
    assert_clean_load(info)
    reference = {}
    for name, w in linear_weights(loaded).items():
        base = name[: -len("weight")]
        if base + "weight_packed" not in files:
            assert bits_equal(w, original[name]), name   # kept in high precision
            continue
        n, k = original[name].shape
        packed, scale = files[base + "weight_packed"], files[base + "weight_scale"]
        assert packed.dtype == torch.uint8 and packed.shape == (n, k // 2)
        assert scale.shape == (n, k // BLOCK[scheme])
        assert scale.dtype == (torch.float8_e4m3fn if scheme == "NVFP4" else torch.uint8)
        # The codes and scales are the library quantizer's, over the whole weight.
        q, s, amax = library_codes(original[name], scheme)
        assert np.array_equal(packed.numpy(), np.asarray(q)), name
        assert np.array_equal(scale.view(torch.uint8).numpy(), s), name
        if scheme == "NVFP4":
            gs = files[base + "weight_global_scale"]
            assert gs.dtype == torch.float32 and gs.shape == (1,)
            a = original[name].float().abs().max()
            assert amax.reshape(-1)[0] == a.item()
            assert torch.equal(gs, (torch.tensor(2688.0) / a).reshape(1))   # the encode scale
        reference[name] = fp4_reference(files, base, scheme)
        assert bits_equal(w, ours[name]), name          # transformers == cuquant dequantize
        assert bits_equal(w, reference[name]), name     # == the format's definition
    assert len(reference) == 14 - (2 if scheme == "MXFP4" else 0)   # lm_head kept
    want = logits(model_with(src, reference), ids)
    assert torch.equal(logits(loaded.eval(), ids), want)
    zero = reference["model.layers.0.self_attn.q_proj.weight"][3, :32]
    assert not zero.any()
    for name, w in reference.items():
        err = (w.float() - original[name].float()).norm() / original[name].float().norm()
        assert err < 0.2, (name, float(err))

    # The default route: compressed on load, decompressed by compressed-tensors.
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert_clean_load(info)
    assert torch.equal(logits(model.eval(), ids), want)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_other_model_dtypes(tmp_path, scheme, dtype):
    # compressed-tensors 0.20.1 decompresses to bfloat16 whatever the model's dtype (its
    # unpack_fp4_from_uint8 defaults to it) and transformers converts that: NVFP4's products
    # are rounded twice there, once by cuquant dequantize; MXFP4's are exact in bfloat16.
    torch.manual_seed(2)
    dt = getattr(torch, dtype)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=256, tie_word_embeddings=False)
    src, out, back = tmp_path / "src", tmp_path / "q", tmp_path / "back"
    transformers.LlamaForCausalLM(cfg).to(dt).save_pretrained(src)
    assert main(["quantize", str(src), str(out), "-f", scheme, "--device", "cpu", "-q"]) == 0
    assert main(["dequantize", str(out), str(back), "--device", "cpu", "-q"]) == 0
    files, ours = read_all(out), read_all(back)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, quantization_config=dequantizing())
    checked = differ = 0
    for name, w in linear_weights(loaded).items():
        base = name[: -len("weight")]
        if base + "weight_packed" not in files:
            continue
        once = fp4_reference(files, base, scheme, dt)
        assert ours[name].dtype == dt and torch.equal(ours[name], once), name
        if scheme == "MXFP4":
            assert torch.equal(w, once), name
        else:
            assert torch.equal(w, fp4_reference(files, base, scheme).to(dt)), name
            differ += not torch.equal(w, once)
        checked += 1
    assert checked == 7
    assert differ == (7 if scheme == "NVFP4" else 0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_inspect_names_the_roles(llama, tmp_path, capsys, scheme):
    src, _ = llama
    out = tmp_path / scheme
    assert main(["quantize", str(src), str(out), "-f", scheme, "--device", "cpu", "-q"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--json", "--filter", "*layers.0.self_attn.q_proj*"]) == 0
    info = json.loads(capsys.readouterr().out)
    roles = {t["name"]: (t["role"], t["dtype"]) for f in info["files"] for t in f["tensors"]}
    m = "model.layers.0.self_attn.q_proj."
    want = {m + "weight_packed": (f"{scheme} codes", "U8"),
            m + "weight_scale": (f"{scheme} scale", "F8_E4M3" if scheme == "NVFP4" else "U8")}
    if scheme == "NVFP4":
        want[m + "weight_global_scale"] = ("NVFP4 global scale", "F32")
    assert roles == want
    assert not info["problems"]
    assert info["quantization_config"]["format"] == CT_FORMAT[scheme]


def test_k_not_a_multiple_of_the_block_stays_in_high_precision(llama, tmp_path, capsys):
    src, _ = llama
    out = tmp_path / "mx"
    assert main(["quantize", str(src), str(out), "-f", "MXFP4", "--device", "cpu"]) == 0
    _, err = capsys.readouterr()
    assert "K=208 is not a multiple of the MXFP4 block of 32" in err
    assert "model.layers.0.mlp.down_proj.weight" in err
    files = read_all(out)
    assert files["model.layers.0.mlp.down_proj.weight"].dtype == torch.bfloat16
    assert "model.layers.0.mlp.down_proj.weight_packed" not in files


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(tmp_path, capsys, scheme, bad):
    w = (np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096).astype(ml_dtypes.bfloat16)
    w[5, 7] = bad
    src = tmp_path / "src"
    src.mkdir()
    ckpt.save_file({"model.layers.0.mlp.up_proj.weight": w}, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["quantize", str(src), str(tmp_path / "q"), "-f", scheme, "--device", "cpu",
                 "-q"]) == 1
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1
    assert "'model.layers.0.mlp.up_proj.weight'" in err and "NaN or infinite" in err
    # A band a row: NVFP4 finds it while it reads the global amax, MXFP4 in its scales.
    with pytest.raises(ckpt.CheckpointError, match="up_proj.weight'. NaN or infinite"):
        ckpt.quantize_checkpoint(src, tmp_path / "q", scheme, device="cpu", chunk_elements=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# ---------------------------------------------------------------------------------------
# Checkpoints written by compressed-tensors itself

def _fp4_scales(m, w, a):
    """compressed-tensors' observers' arithmetic: calculate_qparams, and generate_gparam for
    NVFP4's global scale."""
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    gs = None
    if hasattr(m, "weight_global_scale"):
        gs = generate_gparam(w.float().amin(), w.float().amax())
        m.weight_global_scale.data.copy_(gs)
    if hasattr(m, "input_global_scale"):   # NVFP4's activations (W4A4): a static value
        m.input_global_scale.data.fill_(1.0)
    wg = w.reshape(w.shape[0], -1, a.group_size)
    s, _ = calculate_qparams(wg.amin(-1), wg.amax(-1), a, global_scale=gs)
    m.weight_scale.data.copy_(s.reshape(m.weight_scale.shape))


def ct_fp4_checkpoint(path, scheme: str):
    """A tiny Llama compressed by compressed-tensors with its own observers' arithmetic,
    saved; returns the weights compressed-tensors' own decompression gives."""
    return ct_own_checkpoint(path, scheme, _fp4_scales, spread=True)


# NVFP4A16 and MXFP4A16 are weight-only (what the command writes); NVFP4 and MXFP4 are
# compressed-tensors' W4A4 presets, whose activation parameters dequantize drops.
@pytest.mark.parametrize("scheme", ["NVFP4A16", "MXFP4A16", "NVFP4", "MXFP4"])
def test_dequantize_reads_compressed_tensors_own_fp4(tmp_path, capsys, scheme):
    theirs = ct_fp4_checkpoint(tmp_path / "ct", scheme)
    files = read_all(tmp_path / "ct")
    fmt = "NVFP4" if scheme.startswith("NV") else "MXFP4"
    assert json.loads((tmp_path / "ct" / "config.json").read_text())[
        "quantization_config"]["format"] == CT_FORMAT[fmt]
    assert main(["inspect", str(tmp_path / "ct")]) == 0
    out, _ = capsys.readouterr()
    assert f"{fmt} codes" in out and f"{fmt} scale" in out
    assert main(["dequantize", str(tmp_path / "ct"), str(tmp_path / "back"), "--device",
                 "cpu", "-q"]) == 0
    ours = read_all(tmp_path / "back")
    assert any(n.endswith("input_global_scale") for n in files) == (scheme == "NVFP4")
    assert not any(n.endswith(("weight_packed", "weight_scale", "global_scale")) for n in ours)
    assert "quantization_config" not in json.loads((tmp_path / "back" / "config.json").read_text())
    compared = 0
    for name, w in theirs.items():
        if name == "lm_head.weight":
            continue
        assert bits_equal(ours[name], w.to(torch.bfloat16)), name
        assert bits_equal(ours[name], fp4_reference(files, name[: -len("weight")], fmt)), name
        compared += 1
    assert compared == 7


# ---------------------------------------------------------------------------------------
# The GPU path writes and restores the CPU path's bytes, edge values included

@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("chunk", [None, 1 << 12])
def test_gpu_writes_the_cpu_bytes(tmp_path, scheme, chunk):
    pytest.importorskip("cupy")
    rng = np.random.default_rng(7)
    big = (rng.standard_normal((512, 1024)) * 0.02).astype(np.float32)
    big[:64, :64] *= 1e-36                        # blocks of float32 subnormals
    big[100, :32] = 0                             # an all-zero block
    big[200, 5] = 3e4                             # an outlier
    tiny = (rng.standard_normal((64, 256)) * 1e-30).astype(np.float32)   # tiny global amax
    src = tmp_path / "src"
    src.mkdir()
    ckpt.save_file({"model.layers.0.mlp.up_proj.weight": big.astype(ml_dtypes.bfloat16),
                    "model.layers.0.mlp.down_proj.weight": big[:, :512].astype(np.float16),
                    "model.layers.0.self_attn.q_proj.weight": big[:256, :256],
                    "model.layers.0.self_attn.k_proj.weight": tiny},
                   src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    ckpt.quantize_checkpoint(src, cpu, scheme, device="cpu")
    ckpt.quantize_checkpoint(src, gpu, scheme, device="cuda", chunk_elements=chunk)
    same_shards(cpu, gpu)
    ckpt.dequantize_checkpoint(cpu, tmp_path / "back_cpu", device="cpu")
    ckpt.dequantize_checkpoint(cpu, tmp_path / "back_gpu", device="cuda", chunk_elements=chunk)
    same_shards(tmp_path / "back_cpu", tmp_path / "back_gpu")


def same_shards(a, b):
    names = sorted(p.name for p in a.glob("*.safetensors"))
    assert names and names == sorted(p.name for p in b.glob("*.safetensors"))
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
