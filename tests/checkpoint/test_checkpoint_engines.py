"""The checkpoints `cuquant quantize` writes load correctly in transformers.

A tiny Llama saved by transformers is quantized by the command in every compressed-tensors
scheme; each output is loaded with ``AutoModelForCausalLM.from_pretrained`` (compressed-
tensors installed) and must give an empty load report, every quantized Linear's weight
equal bit for bit to ``cuquant dequantize`` of the same files, and logits equal to those of
a model whose weights come from the torch reading of the format written below from its
definition (docs/checkpoint-formats.md), not from cuquant. AWQ, whose transformers path
needs GPU packages, is checked against an independent unpacking of its files. A checkpoint
written by compressed-tensors itself dequantizes to the weights its own decompression gives.

The CPU cases run in CI (.ci/run installs transformers and compressed-tensors and sets
CUQUANT_REQUIRE_ENGINES=1, so that a missing package fails instead of skipping); the
``cuda`` cases run the command's GPU path: ``python -m pytest -m gpu
tests/checkpoint/test_checkpoint_engines.py``.
"""

from __future__ import annotations

import importlib
import json
import os

import pytest

from cuquant import checkpoint as ckpt
from cuquant.cli import main


def _require(module: str):
    if os.environ.get("CUQUANT_REQUIRE_ENGINES") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


torch = _require("torch")
transformers = _require("transformers")
compressed_tensors = _require("compressed_tensors")
safetensors_torch = _require("safetensors.torch")

# transformers warns that the checkpoint's own quantization_config wins over the one passed
# (all that is passed is to dequantize on load).
pytestmark = pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")

CT_SCHEMES = ("W8A8", "FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "W8A16")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# The MLP's K (intermediate size) is no multiple of 128: the down projections stay in
# high precision under the grouped schemes and are listed in `ignore`.
INTERMEDIATE = 192
# transformers 5.25 with compressed-tensors 0.20.1 cannot load any W4A16_ASYM checkpoint
# compressed (compressed-tensors' own included): the compressed model's zero point is
# [N, K/G] where the files hold the packed [N/8, K/G]. Dequantizing on load works.
COMPRESSED_ROUTE = ("W8A8", "FP8_DYNAMIC", "W4A16", "W8A16")
WEIGHT_ONLY = ("W4A16", "W8A16")


def tiny_llama(tmp_path_factory, intermediate: int, zero_block: bool = False):
    """A two-layer Llama in bfloat16 of MLP width `intermediate`, saved by transformers, and
    a batch of tokens: (path, ids). Its projections have rows of uneven magnitudes; with
    `zero_block`, layer 0's q_proj has an all-zero block (row 3, columns 0-31)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=intermediate, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
        max_position_embeddings=64, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.mul_(torch.exp(torch.randn(p.shape[0], 1)).to(p.dtype))
        if zero_block:
            model.model.layers[0].self_attn.q_proj.weight[3, :32] = 0
    path = tmp_path_factory.mktemp("llama") / "bf16"
    model.save_pretrained(path)
    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    return path, ids


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory, INTERMEDIATE)


def dequantizing():
    """compressed-tensors' config asking transformers to dequantize on load (older releases
    spell it run_compressed=False)."""
    import inspect

    cls = transformers.CompressedTensorsConfig
    if "dequantize" in inspect.signature(cls.__init__).parameters:
        return cls(dequantize=True)
    return cls(run_compressed=False)


def assert_clean_load(info: dict) -> None:
    """An empty load report: no missing, unexpected or mismatched keys, no errors."""
    assert "missing_keys" in info and "unexpected_keys" in info
    assert {k: v for k, v in info.items() if v} == {}


def linear_weights(model) -> dict[str, "torch.Tensor"]:
    return {f"{name}.weight": m.weight.detach() for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)}


def bits_equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


def read_all(path) -> dict:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(f))
    return out


# ---------------------------------------------------------------------------------------
# compressed-tensors, read from its definition

def unpack_words(words, bits: int, count: int):
    """int32 [R, C] -> int32 [R, count]: element i of a row is bits i*bits .. of the row's
    little-endian bit stream, as unsigned."""
    per = 32 // bits
    shifts = torch.arange(per, dtype=torch.int32) * bits
    u = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return u.reshape(words.shape[0], -1)[:, :count]


def ct_reference(files: dict, base: str, scheme: str):
    """The weight compressed-tensors' format defines for module `base`, in float32."""
    s = files[base + "weight_scale"].float()
    if scheme in ("W8A8", "FP8_DYNAMIC"):
        return files[base + "weight"].float() * s
    n, k = files[base + "weight_shape"].tolist()
    bits = 4 if scheme.startswith("W4") else 8
    q = unpack_words(files[base + "weight_packed"], bits, k) - (1 << (bits - 1))
    g = k // s.shape[1]
    if scheme == "W4A16_ASYM":
        zw = files[base + "weight_zero_point"]
        z = unpack_words(zw.T.contiguous(), 4, n).T - 8        # packed along the rows
        q = q - z.repeat_interleave(g, dim=1)
    return q.float() * s.repeat_interleave(g, dim=1)


def model_with(path, weights: dict):
    m = transformers.AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for name, w in weights.items():
            m.get_parameter(name).copy_(w)
    return m.eval()


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", CT_SCHEMES)
def test_transformers_loads_compressed_tensors(llama, tmp_path, scheme, device):
    src, ids = llama
    out, back = tmp_path / scheme, tmp_path / "back"
    assert main(["quantize", str(src), str(out), "-f", scheme, "--device", device, "-q"]) == 0
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["quantization_status"] == "compressed"
    assert qc["config_groups"]["group_0"]["format"] == qc["format"]
    grouped = scheme not in ("W8A8", "FP8_DYNAMIC")
    downs = [f"model.layers.{i}.mlp.down_proj" for i in range(2)]
    assert set(qc["ignore"]) == {"lm_head", *(downs if grouped else ())}

    ckpt.dequantize_checkpoint(out, back, device=device)
    ours = read_all(back)
    files = read_all(out)
    original = read_all(src)

    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, quantization_config=dequantizing())
    assert_clean_load(info)
    reference = {}
    quantized = 0
    for name, w in linear_weights(loaded).items():
        base = name[: -len("weight")]
        if base + "weight_scale" in files:
            quantized += 1
            reference[name] = ct_reference(files, base, scheme).to(torch.bfloat16)
            assert bits_equal(w, ours[name]), name      # transformers == cuquant dequantize
            assert bits_equal(w, reference[name]), name  # == the format's definition
        else:
            assert bits_equal(w, original[name]), name   # kept in high precision
    assert quantized == 14 - (2 if grouped else 0)   # 7 Linear a layer; lm_head kept
    ref_model = model_with(src, reference)
    want = logits(ref_model, ids)
    assert torch.equal(logits(loaded.eval(), ids), want)
    # And the bits are a sane quantization of the original weights.
    for name, w in reference.items():
        err = (w.float() - original[name].float()).norm() / original[name].float().norm()
        assert err < (0.2 if scheme.startswith("W4") else 0.05), (name, float(err))

    if scheme in COMPRESSED_ROUTE:
        # The default route: compressed on load, decompressed by compressed-tensors.
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            out, output_loading_info=True)
        assert_clean_load(info)
        got = logits(model.eval(), ids)
        if scheme in WEIGHT_ONLY:
            assert torch.equal(got, want)
        else:  # activations quantized per token on the fly: close, not equal
            assert torch.isfinite(got).all()
            assert (got.float() - want.float()).norm() < 0.2 * want.float().norm()


# ---------------------------------------------------------------------------------------
# AWQ, read from its definition

AWQ_NIBBLE_OF_COLUMN = (0, 4, 1, 5, 2, 6, 3, 7)   # column 8c + j sits in nibble this[j]


def awq_unpack(words):
    """int32 [R, C] -> int32 [R, 8C] in column order."""
    u = unpack_words(words, 4, words.shape[1] * 8).reshape(words.shape[0], -1, 8)
    return u[:, :, list(AWQ_NIBBLE_OF_COLUMN)].reshape(words.shape[0], -1)


@pytest.mark.parametrize("device", DEVICES)
def test_awq_files(llama, tmp_path, device):
    src, _ = llama
    out, back = tmp_path / "awq", tmp_path / "back"
    assert main(["quantize", str(src), str(out), "-f", "AWQ", "--device", device, "-q"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "awq" and qc["version"] == "gemm"
    assert qc["bits"] == 4 and qc["group_size"] == 128 and qc["zero_point"] is True
    downs = [f"model.layers.{i}.mlp.down_proj" for i in range(2)]
    assert set(qc["modules_to_not_convert"]) == {"lm_head", *downs}
    transformers.AwqConfig.from_dict(qc)   # the loader's config class takes it

    ckpt.dequantize_checkpoint(out, back, device=device)
    ours, files, original = read_all(back), read_all(out), read_all(src)
    checked = 0
    for name, w in original.items():
        base = name[: -len("weight")]
        if base + "qweight" not in files:
            assert bits_equal(ours[name], w) if w.dtype == torch.bfloat16 else True
            continue
        qw, qz, sc = files[base + "qweight"], files[base + "qzeros"], files[base + "scales"]
        n, k = w.shape
        assert qw.dtype == torch.int32 and qw.shape == (k, n // 8)
        assert qz.dtype == torch.int32 and qz.shape == (k // 128, n // 8)
        assert sc.dtype == torch.float16 and sc.shape == (k // 128, n)
        q, z = awq_unpack(qw), awq_unpack(qz)
        deq = (q - z.repeat_interleave(128, dim=0)).float() * sc.float().repeat_interleave(
            128, dim=0)                                                      # [K, N]
        ref = deq.T.contiguous().to(torch.bfloat16)
        assert bits_equal(ours[name], ref), name
        # The codes are those of the zero-point quantizer's definition, from float16.
        x = w.to(torch.float16).float().reshape(n, k // 128, 128)
        lo, hi = x.amin(-1), x.amax(-1)
        s = ((hi - lo).clamp_min(1e-5) / 15).to(torch.float16)
        assert torch.equal(s.T.contiguous(), sc), name
        zz = (-lo / s.float()).round().clamp(0, 15)
        assert torch.equal(zz.T.to(torch.int32), z), name
        qq = ((x / s.float().unsqueeze(-1)).round() + zz.unsqueeze(-1)).clamp(0, 15)
        assert torch.equal(qq.reshape(n, k).T.to(torch.int32), q), name
        checked += 1
    assert checked == 12


# ---------------------------------------------------------------------------------------
# Checkpoints written by compressed-tensors itself

def ct_own_checkpoint(path, scheme: str, set_scales, spread: bool = False):
    """A tiny Llama in `scheme` compressed by compressed-tensors itself, saved, after
    `set_scales(module, weight, weight_args)` set each quantized Linear's parameters (as
    its observers would); returns the weights compressed-tensors' own decompression gives.
    `spread`: rows of the projections scaled by factors up to e**+-6 apart."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, apply_quantization_config,
                                                 preset_name_to_scheme)

    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=256, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    if spread:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("proj.weight"):
                    p.mul_(torch.exp(2 * torch.randn(p.shape[0], 1)).to(p.dtype))
    sch = preset_name_to_scheme(scheme, ["Linear"])
    qc = QuantizationConfig(config_groups={"group_0": sch}, ignore=["lm_head"],
                            quantization_status="frozen")
    apply_quantization_config(model, qc)
    for m in model.modules():
        if hasattr(m, "weight_scale"):
            set_scales(m, m.weight.data, sch.weights)
    comp = ModelCompressor.from_pretrained_model(model)
    comp.compress_model(model)
    model.save_pretrained(path)
    comp.update_config(path)
    comp.decompress_model(model)
    return linear_weights(model)


def _min_max_scales(m, w, a):
    from compressed_tensors.quantization.utils import calculate_qparams

    if a.strategy == "group":
        wg = w.float().reshape(w.shape[0], -1, a.group_size)
        lo, hi = wg.amin(-1), wg.amax(-1)
    else:
        lo, hi = w.float().amin(-1, keepdim=True), w.float().amax(-1, keepdim=True)
    s, z = calculate_qparams(lo.to(w.dtype), hi.to(w.dtype), a)
    m.weight_scale.data.copy_(s.reshape(m.weight_scale.shape))
    if hasattr(m, "weight_zero_point"):
        m.weight_zero_point.data.copy_(z.reshape(m.weight_zero_point.shape))


def ct_checkpoint(path, scheme: str):
    """A tiny Llama compressed by compressed-tensors (min-max scales), saved; returns the
    weights compressed-tensors' own decompression gives."""
    return ct_own_checkpoint(path, scheme, _min_max_scales)


@pytest.mark.parametrize("scheme", CT_SCHEMES)
def test_dequantize_reads_compressed_tensors_own_checkpoints(tmp_path, scheme):
    theirs = ct_checkpoint(tmp_path / "ct", scheme)
    assert main(["dequantize", str(tmp_path / "ct"), str(tmp_path / "back"), "--device",
                 "cpu", "-q"]) == 0
    ours = read_all(tmp_path / "back")
    assert not any(n.endswith(("weight_packed", "weight_scale", "weight_zero_point",
                               "weight_shape")) for n in ours)
    assert "quantization_config" not in json.loads((tmp_path / "back" / "config.json").read_text())
    compared = 0
    for name, w in theirs.items():
        if name == "lm_head.weight":
            continue
        assert bits_equal(ours[name], w.to(torch.bfloat16)), name
        compared += 1
    assert compared == 7
