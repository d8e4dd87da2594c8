"""Whole checkpoints: what gets quantized and what stays, the DeepSeek-V3 FP8 layout and
config, codes equal to the library's own operators on the whole tensor (though streamed in
bands), quantize -> dequantize round trips for every format, UE8M0 scales, shards and the
index, refusals, no partial output left behind, and bounded memory."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from _util import assert_same_bits

import cuquant
from cuquant import checkpoint as ckpt
from cuquant.checkpoint.safetensors import SafetensorsFile, load_file, save_file
from cuquant.checkpoint import CheckpointError

BF16 = ml_dtypes.bfloat16
FORMATS = list(ckpt.FORMATS)
ROOT = Path(cuquant.__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------
# A small checkpoint with the names real models use

def model_tensors(rng) -> dict[str, np.ndarray]:
    """Weights of assorted shapes and dtypes: rows of different scales, a few outliers."""
    def w(n, k, dtype=BF16, scale=0.02):
        a = rng.standard_normal((n, k)).astype(np.float32) * scale
        a *= rng.lognormal(0, 0.5, size=(n, 1)).astype(np.float32)
        a.reshape(-1)[rng.integers(0, a.size, size=max(1, a.size // 2000))] *= 15
        return a.astype(dtype)

    p0, p1 = "model.layers.0.", "model.layers.1."
    return {
        "model.embed_tokens.weight": w(320, 256),
        p0 + "input_layernorm.weight": np.ones(256, BF16),
        p0 + "self_attn.q_proj.weight": w(256, 256),
        p0 + "self_attn.q_proj.bias": w(1, 256)[0],
        p0 + "self_attn.kv_a_proj_with_mqa.weight": w(576, 256),  # DeepSeek-V3: 576 rows
        p0 + "self_attn.rotary_emb.inv_freq": np.linspace(1, 0, 64, dtype=np.float32),
        p0 + "mlp.gate.weight": w(8, 256),  # MoE router
        p0 + "mlp.gate.e_score_correction_bias": np.zeros(8, np.float32),
        p0 + "mlp.experts.0.gate_proj.weight": w(384, 256),
        p0 + "mlp.shared_experts.down_proj.weight": w(256, 384),
        p1 + "mlp.gate_proj.weight": w(200, 384),  # N not a multiple of 128
        p1 + "mlp.odd_proj.weight": w(130, 200, np.float16),  # K not a multiple of 128
        p1 + "self_attn.o_proj.weight": w(256, 256, np.float32, 0.5),
        p1 + "mlp.experts_stacked": rng.standard_normal((2, 8, 16)).astype(BF16),
        "model.position_ids": np.arange(16, dtype=np.int64).reshape(1, 16),
        "model.norm.weight": np.ones(256, np.float32),
        "lm_head.weight": w(320, 256),
    }


QUANTIZED = {  # names each format quantizes under the default skips
    "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
    "model.layers.0.mlp.experts.0.gate_proj.weight",
    "model.layers.0.mlp.shared_experts.down_proj.weight", "model.layers.1.mlp.gate_proj.weight",
    "model.layers.1.mlp.odd_proj.weight", "model.layers.1.self_attn.o_proj.weight",
}


def make_checkpoint(path: Path, rng, shards: int = 2) -> dict[str, np.ndarray]:
    """Write `model_tensors` as shards plus an index, a config and tokenizer files."""
    tensors = model_tensors(rng)
    path.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    parts = [names[i::shards] for i in range(shards)]
    wmap = {}
    for i, part in enumerate(parts):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, path / fname, {"format": "pt"})
        wmap.update({n: fname for n in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": wmap}))
    (path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3",
                                                  "torch_dtype": "bfloat16", "hidden_size": 256}))
    (path / "generation_config.json").write_text('{"eos_token_id": 1}')
    (path / "tokenizer.json").write_text('{"model": {}}')
    (path / "pytorch_model.bin").write_bytes(b"old weights")  # never copied
    return tensors


@pytest.fixture
def model(tmp_path, rng):
    src = tmp_path / "model"
    return src, make_checkpoint(src, rng)


def raw_headers(out: Path) -> dict[str, tuple[str, dict]]:
    """name -> (shard, header entry), read from the bytes, for every shard of `out`."""
    found = {}
    for shard in sorted(out.glob("*.safetensors")):
        data = shard.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        hdr = json.loads(data[8:8 + n])
        hdr.pop("__metadata__", None)
        for k, v in hdr.items():
            found[k] = (shard.name, v)
    return found


def load_dir(out: Path) -> dict[str, np.ndarray]:
    tensors = {}
    for shard in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def metadata_of(out: Path) -> dict:
    with SafetensorsFile(min(out.glob("*.safetensors"))) as f:
        return f.metadata


def quantize(src, dst, fmt, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("chunk_elements", 5000)  # many bands per tensor
    return ckpt.quantize_checkpoint(src, dst, fmt, **kw)


# ---------------------------------------------------------------------------------------
# What is quantized

def test_default_skips_take_whole_names(model, tmp_path):
    src, _ = model
    rep = quantize(src, tmp_path / "q", "fp8-block")
    done = {r.name for r in rep.records if r.action == "quantized"}
    assert done == QUANTIZED
    kept = {r.name: r.reason for r in rep.records if r.action == "kept"}
    assert kept["model.layers.0.mlp.gate.weight"] == "matches '*.gate.weight'"  # the router...
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in done  # ...not gate_proj
    assert kept["lm_head.weight"].startswith("matches")
    assert kept["model.embed_tokens.weight"].startswith("matches")
    assert kept["model.layers.1.mlp.experts_stacked"] == "3-D"
    assert kept["model.position_ids"] == "dtype I64"
    assert kept["model.layers.0.self_attn.q_proj.bias"] == "1-D"


def test_skip_patterns(model, tmp_path):
    src, _ = model
    rep = quantize(src, tmp_path / "a", "int8-channel", skip=["*.q_proj.*", "*odd_proj*"])
    done = {r.name for r in rep.records if r.action == "quantized"}
    assert done == QUANTIZED - {"model.layers.0.self_attn.q_proj.weight",
                                "model.layers.1.mlp.odd_proj.weight"}
    rep = quantize(src, tmp_path / "b", "int8-channel", default_skip=False)
    done = {r.name for r in rep.records if r.action == "quantized"}
    assert done == QUANTIZED | {"lm_head.weight", "model.embed_tokens.weight",
                                "model.layers.0.mlp.gate.weight"}


# ---------------------------------------------------------------------------------------
# The DeepSeek-V3 FP8 layout

def test_fp8_block_deepseek_layout(model, tmp_path):
    src, tensors = model
    out = tmp_path / "fp8"
    quantize(src, out, "fp8-block")
    hdr = raw_headers(out)
    kv = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    assert hdr[kv][1]["dtype"] == "F8_E4M3" and hdr[kv][1]["shape"] == [576, 256]
    assert hdr[kv + "_scale_inv"][1]["dtype"] == "F32"
    assert hdr[kv + "_scale_inv"][1]["shape"] == [5, 2]  # ceil(576/128), ceil(256/128)
    assert hdr[kv][0] == hdr[kv + "_scale_inv"][0]  # same shard
    for name in QUANTIZED:
        n, k = tensors[name].shape
        assert hdr[name][1]["dtype"] == "F8_E4M3"
        assert hdr[name + "_scale_inv"][1]["shape"] == [-(-n // 128), -(-k // 128)]
    for name, a in tensors.items():  # everything else untouched, dtype and all
        if name not in QUANTIZED:
            assert name + "_scale_inv" not in hdr
            assert_same_bits(load_dir(out)[name], a, name)
    assert set(hdr) == set(tensors) | {n + "_scale_inv" for n in QUANTIZED}

    meta = metadata_of(out)
    assert meta["format"] == "pt" and meta["cuquant.format"] == "fp8-block"
    assert meta["cuquant.version"] == cuquant.__version__
    assert meta["cuquant.block_size"] == "128,128"

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v3" and cfg["torch_dtype"] == "bfloat16"
    qc = cfg["quantization_config"]
    assert {k: qc[k] for k in ("quant_method", "fmt", "activation_scheme", "weight_block_size")} \
        == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128]}
    assert "scale_fmt" not in qc
    assert qc["ignored_layers"] == qc["modules_to_not_convert"]
    assert set(qc["ignored_layers"]) == {"lm_head", "model.layers.0.mlp.gate"}
    assert (out / "tokenizer.json").read_text() == '{"model": {}}'
    assert (out / "generation_config.json").exists()
    assert not (out / "pytorch_model.bin").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_index_and_shards(model, tmp_path):
    src, _ = model
    out = tmp_path / "q"
    rep = quantize(src, out, "fp8-row", max_shard_size=60_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    hdr = raw_headers(out)
    assert len(rep.shards) > 2
    assert sorted(set(index["weight_map"].values())) == sorted(rep.shards)
    assert {k: v[0] for k, v in hdr.items()} == index["weight_map"]
    total = sum(v[1]["data_offsets"][1] - v[1]["data_offsets"][0] for v in hdr.values())
    assert index["metadata"]["total_size"] == total == rep.bytes_out
    assert index["metadata"]["cuquant_format"] == "fp8-row"
    for shard in rep.shards:  # no shard over the limit unless one tensor is
        size = sum(v[1]["data_offsets"][1] - v[1]["data_offsets"][0]
                   for v in hdr.values() if v[0] == shard)
        biggest = max(v[1]["data_offsets"][1] - v[1]["data_offsets"][0]
                      for v in hdr.values() if v[0] == shard)
        assert size <= 60_000 or size - biggest <= 60_000


def test_single_file_and_index_inputs(model, tmp_path, rng):
    src, _ = model
    a = quantize(src / "model.safetensors.index.json", tmp_path / "a", "int8-channel")
    b = quantize(src, tmp_path / "b", "int8-channel")
    assert [r.to_json() for r in a.records] == [r.to_json() for r in b.records]
    one = tmp_path / "one.safetensors"
    save_file({"x.weight": rng.standard_normal((130, 64)).astype(BF16)}, one)
    c = quantize(one, tmp_path / "c", "int8-channel")
    assert c.count("quantized") == 1
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "model-00001-of-00001.safetensors", "model.safetensors.index.json"]


# ---------------------------------------------------------------------------------------
# Codes equal the library's, round trips restore the library's dequantization

def _library(fmt: str, w: np.ndarray, group: int = 128):
    f = ckpt.FORMATS[fmt]
    fn = getattr(cuquant, f.quantize_fn)
    return fn(w, group_size=group) if f.grouped else fn(w)


def _library_back(fmt: str, q, s, dtype, group: int = 128):
    f = ckpt.FORMATS[fmt]
    fn = getattr(cuquant, f.dequantize_fn)
    return fn(q, s, dtype, group_size=group) if f.grouped else fn(q, s, dtype)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip(model, tmp_path, fmt):
    src, tensors = model
    q_dir, back_dir = tmp_path / "q", tmp_path / "back"
    rep = quantize(src, q_dir, fmt)
    f = ckpt.FORMATS[fmt]
    got = load_dir(q_dir)
    expect_quantized = {n for n in QUANTIZED if f.unfit(*tensors[n].shape, 128) is None}
    assert {r.name for r in rep.records if r.action == "quantized"} == expect_quantized
    for name in expect_quantized:
        q, s = _library(fmt, tensors[name])
        assert_same_bits(got[name], q, name)
        assert_same_bits(got[name + f.suffix], s, name + f.suffix)
    info = ckpt.inspect_checkpoint(q_dir)
    assert info["problems"] == []
    assert info["totals"][f"{fmt} codes"]["tensors"] == len(expect_quantized)

    back = ckpt.dequantize_checkpoint(q_dir, back_dir, device="cpu", chunk_elements=3000)
    restored = load_dir(back_dir)
    assert set(restored) == set(tensors)
    assert back.count("dequantized") == len(expect_quantized)
    for name, a in tensors.items():
        if name in expect_quantized:
            q, s = _library(fmt, a)
            want = _library_back(fmt, q, s, a.dtype)
            assert restored[name].dtype == a.dtype  # each weight's own type comes back
            assert_same_bits(restored[name], want, name)
            w32, r32 = a.astype(np.float32), restored[name].astype(np.float32)
            assert np.abs(r32 - w32).max() <= 0.25 * np.abs(w32).max()
        else:
            assert_same_bits(restored[name], a, name)
    cfg = json.loads((back_dir / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == "bfloat16"
    assert (back_dir / "tokenizer.json").exists()


def test_int4_group_keeps_unfit_weights(model, tmp_path):
    src, _ = model
    rep = quantize(src, tmp_path / "q", "int4-group", group_size=128)
    kept = {r.name: r.reason for r in rep.records if r.action == "kept"}
    assert kept["model.layers.1.mlp.odd_proj.weight"] == "K=200 is not a multiple of the group size 128"
    hdr = raw_headers(tmp_path / "q")
    name = "model.layers.0.mlp.shared_experts.down_proj.weight"  # [256, 384]
    assert hdr[name][1]["dtype"] == "I8" and hdr[name][1]["shape"] == [256, 192]
    assert hdr[name + "_params"][1]["shape"] == [256 * 384 // 128, 2]
    assert metadata_of(tmp_path / "q")["cuquant.group_size"] == "128"
    qc = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "cuquant" and qc["format"] == "int4-group"
    assert "model.layers.1.mlp.odd_proj" in qc["ignored_layers"]


@pytest.mark.parametrize("fmt", ["fp8-block", *ckpt.ENGINE_FORMATS])
def test_bands_do_not_change_the_bits(model, tmp_path, fmt):
    # Bands of one row (eight for the packed zero points, 128 for tiles) against one band.
    src, _ = model
    quantize(src, tmp_path / "small", fmt, chunk_elements=1)
    quantize(src, tmp_path / "big", fmt, chunk_elements=1 << 30)
    for shard in (tmp_path / "small").glob("*.safetensors"):
        assert shard.read_bytes() == (tmp_path / "big" / shard.name).read_bytes()
    ckpt.dequantize_checkpoint(tmp_path / "small", tmp_path / "back_small", device="cpu",
                               chunk_elements=1)
    ckpt.dequantize_checkpoint(tmp_path / "small", tmp_path / "back_big", device="cpu",
                               chunk_elements=1 << 30)
    for shard in (tmp_path / "back_small").glob("*.safetensors"):
        assert shard.read_bytes() == (tmp_path / "back_big" / shard.name).read_bytes()


def test_error_report(model, tmp_path):
    src, tensors = model
    rep = quantize(src, tmp_path / "q", "int8-channel")
    data = json.loads(json.dumps(rep.to_json(), allow_nan=False))
    assert data["summary"]["quantized"] == len(QUANTIZED)
    assert data["summary"]["bytes_in"] == sum(a.nbytes for a in tensors.values())
    (g,) = [g for g in data["groups"] if g["group"] == "int8-channel"]
    assert 20 < g["sqnr_db"] < 60 and g["worst_sqnr_db"] <= g["sqnr_db"] + 1e-9
    by_name = {t["name"]: t for t in data["tensors"]}
    name = "model.layers.1.self_attn.o_proj.weight"
    w = tensors[name]
    q, s = _library("int8-channel", w)
    err = _library_back("int8-channel", q, s, np.float32) - w
    assert by_name[name]["max_abs_err"] == pytest.approx(float(np.abs(err).max()))
    want = 10 * np.log10(np.sum(w.astype(np.float64) ** 2) / np.sum(err.astype(np.float64) ** 2))
    assert by_name[name]["sqnr_db"] == pytest.approx(want, abs=1e-3)
    assert "sqnr_db" not in by_name["lm_head.weight"]


# ---------------------------------------------------------------------------------------
# UE8M0 scales

def test_ceil_pow2_edges():
    tiny = np.float32(np.ldexp(1.0, -149))
    s = np.array([1.0, 1.5, 0.75, 3.0, 2.0**-126, 1.1 * 2.0**-130, tiny, 3 * tiny, np.inf, np.nan,
                  np.float32(np.finfo(np.float32).max) / 448], dtype=np.float32)
    got = ckpt.ceil_pow2(s)
    want = [1.0, 2.0, 1.0, 4.0, 2.0**-126, 2.0**-129, tiny, 4 * tiny, np.inf, np.nan, 2.0**120]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))


def test_ue8m0_scales_and_codes(model, tmp_path):
    src, tensors = model
    out = tmp_path / "ue"
    rep = quantize(src, out, "fp8-block", scale_format="ue8m0")
    got = load_dir(out)
    for name in QUANTIZED:
        s = got[name + "_scale_inv"]
        m, _ = np.frexp(s.astype(np.float64))
        assert np.all(m == 0.5), name  # powers of two
        _, s_f32 = cuquant.quantize_fp8_per_block(tensors[name])
        assert np.all(s >= s_f32) and np.all(s < 2 * s_f32)
        w = tensors[name]
        want = np.empty(w.shape, np.uint8)
        for i in range(s.shape[0]):  # the contract's math, tile by tile, with the stored scale
            for j in range(s.shape[1]):
                tile = w[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)]
                q, _ = cuquant.quantize_fp8_per_tensor(tile, scale=float(s[i, j]))
                want[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)] = q.view(np.uint8)
        assert_same_bits(got[name], want, name)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["scale_fmt"] == "ue8m0"
    assert metadata_of(out)["cuquant.scale_format"] == "ue8m0"
    (g,) = [g for g in rep.groups() if g["group"] == "fp8-block"]
    assert g["sqnr_db"] > 25
    ckpt.dequantize_checkpoint(out, tmp_path / "back", device="cpu")


def test_ue8m0_edge_values(tmp_path):
    """Zeros, NaN, inf, subnormals and a tile of tiny values through the UE8M0 path."""
    w = np.zeros((130, 260), np.float32)
    w[0, :5] = [np.nan, 1.0, -2.5, np.inf, -0.0]
    w[128:, :128] = np.float32(1e-40)  # a subnormal tile: scale 2^-k below float32's normal range
    w[128:, 128:256] = np.linspace(-3, 3, 2 * 128, dtype=np.float32).reshape(2, 128)
    save_file({"x.weight": w}, tmp_path / "w.safetensors")
    quantize(tmp_path / "w.safetensors", tmp_path / "q", "fp8-block", scale_format="ue8m0")
    got = load_dir(tmp_path / "q")
    s = got["x.weight_scale_inv"]
    assert np.isnan(s[0, 0]) and s[1, 0] == np.float32(2.0**-141)  # 1e-40 / 448, rounded up
    want = np.empty(w.shape, np.uint8)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)]
            if np.isfinite(s[i, j]):
                q = cuquant.quantize_fp8_per_tensor(tile, scale=s[i, j:j + 1])[0].view(np.uint8)
            else:  # a NaN scale (the tile holds NaN): every quotient is NaN, code 0x7F
                q = np.full(tile.shape, 0x7F, np.uint8)
            want[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)] = q
    assert_same_bits(got["x.weight"], want)


# ---------------------------------------------------------------------------------------
# Refusals and clean failure

def test_missing_scale_is_an_error(model, tmp_path):
    src, _ = model
    for fmt in ("fp8-block", "int8-channel"):
        out = tmp_path / fmt
        quantize(src, out, fmt)
        f = ckpt.FORMATS[fmt]
        victim = "model.layers.0.self_attn.q_proj.weight"
        for shard in out.glob("*.safetensors"):
            with SafetensorsFile(shard) as sf:
                if victim + f.suffix in sf.tensors:
                    data = {n: sf.read(n) for n in sf.tensors if n != victim + f.suffix}
                    meta = sf.metadata
            if victim + f.suffix in SafetensorsFile(shard).tensors:
                save_file(data, shard, meta)
        with pytest.raises(CheckpointError, match=f"scale '{victim}{f.suffix}'.* is missing"):
            ckpt.dequantize_checkpoint(out, tmp_path / "back", device="cpu")
        assert not (tmp_path / "back").exists()
        info = ckpt.inspect_checkpoint(out)
        assert len(info["problems"]) == 1


def test_foreign_fp8_checkpoint(tmp_path, rng):
    """A DeepSeek-V3-style checkpoint from elsewhere: no cuquant metadata; the restored
    type comes from config.json."""
    w = rng.standard_normal((300, 200)).astype(np.float32)
    q, s = cuquant.quantize_fp8_per_block(w)
    src = tmp_path / "ds"
    src.mkdir()
    save_file({"a.weight": q, "a.weight_scale_inv": s, "n.weight": np.ones(4, BF16)},
              src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"torch_dtype": "float16", "quantization_config":
                                                 {"quant_method": "fp8"}}))
    ckpt.dequantize_checkpoint(src, tmp_path / "back", device="cpu")
    got = load_dir(tmp_path / "back")
    assert_same_bits(got["a.weight"], cuquant.dequantize_fp8_per_block(q, s, "float16"))
    with pytest.raises(CheckpointError, match="already quantized"):
        quantize(src, tmp_path / "again", "fp8-block")
    save_file({"a.weight": q}, src / "model.safetensors")  # scale gone
    with pytest.raises(CheckpointError, match="is missing"):
        ckpt.dequantize_checkpoint(src, tmp_path / "back2", device="cpu")


def test_output_rules(model, tmp_path):
    src, _ = model
    out = tmp_path / "q"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists; pass --overwrite"):
        quantize(src, out, "fp8-row")
    assert (out / "keep.txt").read_text() == "mine"
    quantize(src, out, "fp8-row", overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    with pytest.raises(CheckpointError, match="would replace the input"):
        quantize(src, src, "fp8-row", overwrite=True)
    with pytest.raises(CheckpointError, match="would replace the input"):
        quantize(src, tmp_path, "fp8-row", overwrite=True)
    with pytest.raises(CheckpointError, match="unknown format"):
        quantize(src, tmp_path / "x", "int3")
    with pytest.raises(CheckpointError, match="fp8-block only"):
        quantize(src, tmp_path / "x", "int8-channel", scale_format="ue8m0")
    with pytest.raises(CheckpointError, match="no such file"):
        quantize(tmp_path / "nothing", tmp_path / "x", "int8-channel")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "q"]


def test_failure_leaves_nothing(model, tmp_path, monkeypatch):
    src, _ = model
    calls = []

    def boom(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(*a, **k)

    real = ckpt.quantize._quantize_one
    monkeypatch.setattr(ckpt.quantize, "_quantize_one", boom)
    with pytest.raises(OSError):
        quantize(src, tmp_path / "q", "fp8-block")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_space_check(model, tmp_path, monkeypatch):
    src, _ = model

    class Usage:
        free = 1000

    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage)
    with pytest.raises(CheckpointError, match="not enough disk space"):
        quantize(src, tmp_path / "q", "fp8-block")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_corrupt_inputs(tmp_path, model):
    src, _ = model
    (src / "model.safetensors.index.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="corrupt index"):
        ckpt.open_checkpoint(src)
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00009-of-00009.safetensors"}}))
    with pytest.raises(CheckpointError, match="missing"):
        ckpt.open_checkpoint(src)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no .safetensors"):
        ckpt.open_checkpoint(empty)


# ---------------------------------------------------------------------------------------
# Streaming: memory follows the band, not the model

_CHILD = """
import sys
sys.path.insert(0, {root!r})
from cuquant import checkpoint

def peak_kib():
    # VmHWM belongs to this process image; ru_maxrss can carry the parent's peak over
    # fork and exec on Linux
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

if {run!r}:
    checkpoint.quantize_checkpoint({src!r}, {dst!r}, "int8-channel", device="cpu",
                                   chunk_elements=1 << 19)
print(peak_kib())
"""


def peak_rss_kib(src, dst, run: bool) -> int:
    code = _CHILD.format(root=str(ROOT), src=str(src), dst=str(dst), run=run)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM (Linux)")
def test_peak_memory_stays_near_one_band(tmp_path):
    rng = np.random.default_rng(0)
    src = tmp_path / "big"
    src.mkdir()
    row = rng.standard_normal((1, 2048)).astype(np.float32)
    for s in range(4):  # 4 shards x 8 tensors x 4 MiB = 128 MiB of bf16
        tensors = {f"layers.{s}.{i}.weight": (row * rng.lognormal(size=(1024, 1))).astype(BF16)
                   for i in range(8)}
        save_file(tensors, src / f"model-{s}.safetensors")
    model_mib = sum(p.stat().st_size for p in src.iterdir()) / 2**20
    base = peak_rss_kib(src, tmp_path / "unused", run=False) / 1024
    peak = peak_rss_kib(src, tmp_path / "q", run=True) / 1024
    print(f"model {model_mib:.0f} MiB, largest tensor 4 MiB; peak RSS {peak:.0f} MiB, "
          f"{peak - base:.0f} MiB above the bare interpreter ({base:.0f} MiB)")
    assert peak - base < 48, (peak, base)


@pytest.mark.parametrize("fmt,sym", [("W4A16_ASYM", False), ("W4A16", True), ("W8A16", True)])
def test_packed_round_trip_is_the_quantizers_reconstruction(tmp_path, rng, fmt, sym):
    """N = 130 (not a multiple of 8: the last word of packed zero points is half padding):
    the restored weight is the quantizer's own reconstruction, whatever the bands."""
    import cuquant

    w = (rng.standard_normal((130, 256)) * 0.05).astype(ml_dtypes.bfloat16)
    src = tmp_path / "m"
    src.mkdir()
    save_file({"layer.weight": w}, src / "model.safetensors", {"format": "pt"})
    (src / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    bits = 8 if fmt == "W8A16" else 4
    _, _, zeros, recon = cuquant.quantize_groupwise_zero_point(w, bits, 128, symmetric=sym)
    for chunk in (1, 1 << 30):
        out = tmp_path / f"q{chunk}"
        quantize(src, out, fmt, chunk_elements=chunk)
        files = load_dir(out)
        assert files["layer.weight_shape"].tolist() == [130, 256]
        if not sym:
            zp = files["layer.weight_zero_point"]
            assert zp.dtype == np.int32 and zp.shape == (17, 2)
            nib = (zp.view(np.uint32)[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
            z = nib.transpose(0, 2, 1).reshape(136, 2)
            assert np.array_equal(z[:130], zeros.astype(np.float32)) and not z[130:].any()
        ckpt.dequantize_checkpoint(out, tmp_path / f"back{chunk}", device="cpu",
                                   chunk_elements=chunk)
        back = load_dir(tmp_path / f"back{chunk}")["layer.weight"]
        assert back.dtype == w.dtype
        assert np.array_equal(back.view(np.uint16), recon.view(np.uint16))


@pytest.mark.parametrize("fmt", sorted(ckpt.ENGINE_FORMATS))
def test_weights_of_two_dtypes_in_one_shard_come_back_each_in_its_own(tmp_path, rng, fmt):
    """The shard records each weight's dtype under the weight's name; the stored tensors of
    engine formats have other names (weight_packed, qweight), and still find it."""
    w = (rng.standard_normal((64, 256)) * 0.02).astype(np.float32)
    src = tmp_path / "in"
    src.mkdir()
    save_file({"a.up_proj.weight": w.astype(ml_dtypes.bfloat16),
               "b.up_proj.weight": w.astype(np.float16)}, src / "model.safetensors")
    (src / "config.json").write_text('{"model_type": "llama", "torch_dtype": "float32"}')
    out, back = tmp_path / "q", tmp_path / "back"
    ckpt.quantize_checkpoint(src, out, fmt, device="cpu", group_size=32, stats=False)
    ckpt.dequantize_checkpoint(out, back, device="cpu")
    got = {}
    for shard in back.glob("*.safetensors"):
        got.update(load_file(shard))
    assert got["a.up_proj.weight"].dtype == ml_dtypes.bfloat16
    assert got["b.up_proj.weight"].dtype == np.float16
