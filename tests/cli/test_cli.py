"""The command line: quantize -> inspect -> dequantize for every format, the summary and
the JSON report, progress only when asked, every refusal as one line and a non-zero exit
with nothing half-written left behind, and the demo."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_checkpoint import QUANTIZED, load_dir, make_checkpoint

import cuquant
from cuquant.checkpoint import safetensors as _safetensors
from cuquant import checkpoint as ckpt
from cuquant.cli import main

ROOT = Path(cuquant.__file__).resolve().parents[1]
FORMATS = list(ckpt.COMMAND_FORMATS)
# What a format stores beside module M for its weight M.weight.
STORED = {"fp8-block": ("weight", "weight_scale_inv"), "W8A8": ("weight", "weight_scale"),
          "FP8_DYNAMIC": ("weight", "weight_scale"),
          "W4A16": ("weight_packed", "weight_scale", "weight_shape"),
          "W4A16_ASYM": ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point"),
          "W8A16": ("weight_packed", "weight_scale", "weight_shape"),
          "AWQ": ("qweight", "qzeros", "scales"),
          "NVFP4": ("weight_packed", "weight_scale", "weight_global_scale"),
          "MXFP4": ("weight_packed", "weight_scale")}


@pytest.fixture
def model(tmp_path, rng):
    src = tmp_path / "model"
    make_checkpoint(src, rng)
    return src


def run_cli(*args, env_extra=None, preexec=None):
    """`python -m cuquant ARGS` in a child process (exit code, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, "-m", "cuquant", *map(str, args)], capture_output=True,
                       text=True, env=env, preexec_fn=preexec, cwd=ROOT, check=False)
    return p.returncode, p.stdout, p.stderr


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_inspect_dequantize(model, tmp_path, capsys, fmt):
    q, back = tmp_path / "q", tmp_path / "back"
    assert main(["quantize", str(model), str(q), "--format", fmt, "--device", "cpu",
                 "--report", str(tmp_path / "r.json")]) == 0
    out, err = capsys.readouterr()
    assert err == "" or "warning" in err  # no progress bar when stderr is not a terminal
    assert f"to {fmt}, kept" in out and "SQNR dB" in out and "total" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["format"] == fmt and report["device"] == "cpu"
    assert report["cuquant_version"] == cuquant.__version__
    # The grouped formats take 16-bit weights whose K is a multiple of 128 only.
    wanted = len(QUANTIZED) - (1 if fmt in ("fp8-block", "W8A8", "FP8_DYNAMIC") else 3)
    assert report["summary"]["quantized"] >= wanted
    (group,) = [g for g in report["groups"] if g["group"] == fmt]
    assert group["sqnr_db"] > 10 and group["max_abs_err"] > 0

    assert main(["inspect", str(q)]) == 0
    out, _ = capsys.readouterr()
    assert " codes" in out and "high precision" in out
    m = "model.layers.0.self_attn.q_proj."
    assert m + STORED[fmt][-1] in out
    assert main(["inspect", str(q), "--json", "--filter", "*q_proj*"]) == 0
    info = json.loads(capsys.readouterr().out)
    names = {t["name"] for f in info["files"] for t in f["tensors"]}
    assert names == {m + s for s in STORED[fmt]} | {m + "bias"}
    assert not info["problems"]

    assert main(["dequantize", str(q), str(back), "--device", "cpu"]) == 0
    out, _ = capsys.readouterr()
    assert "dequantized" in out
    restored, original = load_dir(back), load_dir(model)
    assert set(restored) == set(original)
    for name, a in original.items():
        assert restored[name].dtype == a.dtype and restored[name].shape == a.shape
    assert "quantization_config" not in json.loads((back / "config.json").read_text())


def test_python_dash_m_and_version():
    rc, out, err = run_cli("--version")
    assert rc == 0 and out.strip() == f"cuquant {cuquant.__version__}"
    rc, out, err = run_cli("quantize", "--help")
    assert rc == 0 and "*.gate.weight" in out and "--scale-format" in out
    rc, out, err = run_cli()
    assert rc == 2 and "COMMAND" in err


def test_progress_when_asked(model, tmp_path, capsys):
    assert main(["quantize", str(model), str(tmp_path / "q"), "-f", "FP8_DYNAMIC", "--device", "cpu",
                 "--progress", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "tensors" in err and "ETA" in err and "100.0%" in err


# ---------------------------------------------------------------------------------------
# Refusals: one line, non-zero, no traceback, nothing left under the final name

def _refused(rc, err, *words):
    assert rc != 0
    assert "Traceback" not in err
    assert all(w in err for w in words), err


def test_missing_input(tmp_path):
    rc, _, err = run_cli("quantize", tmp_path / "nope", tmp_path / "out", "-f", "fp8-block")
    _refused(rc, err, "no such file or directory")
    assert leftovers(tmp_path) == []
    rc, _, err = run_cli("inspect", tmp_path / "nope.safetensors")
    _refused(rc, err, "no such file")


@pytest.mark.parametrize("damage", ["truncated header", "corrupt json", "truncated data",
                                    "not safetensors"])
def test_damaged_input(model, tmp_path, damage):
    shard = min(model.glob("*.safetensors"))
    data = shard.read_bytes()
    n = int.from_bytes(data[:8], "little")
    if damage == "truncated header":
        shard.write_bytes(data[: 8 + n // 2])
    elif damage == "corrupt json":
        shard.write_bytes(data[:8] + b"#" + data[9:])
    elif damage == "truncated data":
        shard.write_bytes(data[:-100])
    else:
        shard.write_bytes(b"GGUF" + bytes(100))
    out = tmp_path / "out"
    rc, _, err = run_cli("quantize", model, out, "-f", "fp8-block")
    _refused(rc, err, "cuquant: error:", shard.name)
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() and leftovers(tmp_path) == ["model"]


def test_unknown_format(model, tmp_path):
    rc, _, err = run_cli("quantize", model, tmp_path / "out", "-f", "int3")
    _refused(rc, err, "invalid choice", "int3")
    assert rc == 2


def test_output_exists(model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious").write_text("keep me")
    rc, _, err = run_cli("quantize", model, out, "-f", "W8A8")
    _refused(rc, err, "already exists", "--overwrite")
    assert leftovers(out) == ["precious"]
    rc, _, err = run_cli("dequantize", model, out)
    _refused(rc, err, "already exists")
    rc, _, err = run_cli("quantize", model, out, "-f", "W8A8", "--overwrite")
    assert rc == 0, err
    assert "precious" not in leftovers(out)
    assert leftovers(tmp_path) == ["model", "out"]


def test_disk_full(model, tmp_path, capsys, monkeypatch):
    real = _safetensors.SafetensorsWriter.write
    count = []

    def write(self, name, data):
        count.append(1)
        if len(count) > 6:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, name, data)

    monkeypatch.setattr(_safetensors.SafetensorsWriter, "write", write)
    out = tmp_path / "out"
    assert main(["quantize", str(model), str(out), "-f", "fp8-block", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device while writing" in err and str(out) in err
    assert leftovers(tmp_path) == ["model"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE semantics")
def test_file_size_limit_in_a_real_process(model, tmp_path):
    """The kernel refuses the write (as on a full disk): the child cleans up and says so."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    out = tmp_path / "out"
    rc, _, err = run_cli("quantize", model, out, "-f", "fp8-block", "--device", "cpu",
                         preexec=limit)
    _refused(rc, err, "File too large", "while writing")
    assert leftovers(tmp_path) == ["model"]


def test_interrupt_cleans_up(model, tmp_path, capsys, monkeypatch):
    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.quantize, "_quantize_one", stop)
    assert main(["quantize", str(model), str(tmp_path / "out"), "-f", "fp8-block",
                 "--device", "cpu"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert leftovers(tmp_path) == ["model"]


def test_missing_scale_on_dequantize(model, tmp_path, capsys):
    q = tmp_path / "q"
    assert main(["quantize", str(model), str(q), "-f", "fp8-block", "--device", "cpu", "-q"]) == 0
    victim = "model.layers.1.mlp.gate_proj.weight_scale_inv"
    for shard in q.glob("*.safetensors"):
        t = _safetensors.load_file(shard)
        if victim in t:
            meta = _safetensors.SafetensorsFile(shard).metadata
            del t[victim]
            _safetensors.save_file(t, shard, meta)
    assert main(["dequantize", str(q), str(tmp_path / "back")]) == 1
    err = capsys.readouterr().err
    assert "is missing" in err and victim in err
    assert not (tmp_path / "back").exists()
    assert main(["inspect", str(q)]) == 1


def test_bad_device_and_sizes(model, tmp_path, capsys):
    assert main(["quantize", str(model), str(tmp_path / "o"), "-f", "FP8_DYNAMIC",
                 "--max-shard-size", "lots"]) == 1
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
    if not ckpt.gpu_available():
        assert main(["quantize", str(model), str(tmp_path / "o"), "-f", "FP8_DYNAMIC",
                     "--device", "cuda"]) == 1
        assert "no CUDA device" in capsys.readouterr().err
    assert leftovers(tmp_path) == ["model"]


def test_parse_size():
    assert ckpt.parse_size("5GB") == 5 * 10**9
    assert ckpt.parse_size("2GiB") == 2 << 30
    assert ckpt.parse_size("500mb") == 500 * 10**6
    assert ckpt.parse_size(1234) == 1234


# ---------------------------------------------------------------------------------------
# The demo

def test_demo(tmp_path, capsys):
    from cuquant.cli.demo import run_demo

    png = tmp_path / "demo.png"
    assert run_demo(size="3MB", out=tmp_path / "work", device="cpu", plot=str(png),
                    progress=False) == 0
    out = capsys.readouterr().out
    for fmt in FORMATS:
        row = next((line for line in out.splitlines() if line.startswith(fmt)), None)
        assert row is not None, f"{fmt} missing from the demo table:\n{out}"
        assert "dB" not in row and len(row.split()) >= 7
    assert "bf16 (input)" in out
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == sorted(["bf16", *FORMATS])
    cfg = json.loads((tmp_path / "work" / "fp8-block" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "fp8"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_model_is_realistic(tmp_path):
    from cuquant.cli.demo import build_model, model_shape

    shape = build_model(tmp_path / "m", 4 * 10**6)
    assert shape == model_shape(4 * 10**6) and shape.layers >= 1
    t = load_dir(tmp_path / "m")
    assert sum(a.nbytes for a in t.values()) == shape.nbytes() <= 4 * 10**6
    w = t["model.layers.0.mlp.up_proj.weight"].astype(np.float32)
    rows = np.abs(w).max(axis=1)
    assert rows.max() > 3 * np.median(rows)  # rows of different scales, outliers
    assert np.abs(w).max() > 10 * w.std()
    assert t["model.norm.weight"].shape == (shape.hidden,)


def test_demo_cli_temp_dir_removed(tmp_path):
    rc, out, err = run_cli("demo", "--size", "2MB", "--device", "cpu", "--plot", "none",
                           env_extra={"TMPDIR": str(tmp_path)})
    assert rc == 0, err
    assert "fp8-block" in out and "SQNR dB" in out
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------
# The engine formats: weights they cannot take, and inputs dequantize refuses

def test_unfit_weights_stay_and_are_listed(model, tmp_path, capsys):
    q = tmp_path / "q"
    assert main(["quantize", str(model), str(q), "-f", "W4A16", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    # odd_proj is [130, 200]: K is no multiple of 128; o_proj is float32
    assert "K=200 is not a multiple of the group size 128" in err
    assert "model.layers.1.mlp.odd_proj.weight" in err and "float32 weights" in err
    qc = json.loads((q / "config.json").read_text())["quantization_config"]
    assert {"model.layers.1.mlp.odd_proj", "model.layers.1.self_attn.o_proj",
            "lm_head"} <= set(qc["ignore"])
    kept = load_dir(q)
    assert kept["model.layers.1.mlp.odd_proj.weight"].dtype == load_dir(model)[
        "model.layers.1.mlp.odd_proj.weight"].dtype
    assert "model.layers.1.mlp.odd_proj.weight_packed" not in kept
    # AWQ also needs N a multiple of 8
    assert main(["quantize", str(model), str(tmp_path / "a"), "-f", "AWQ", "--device", "cpu",
                 "-q"]) == 0
    qc = json.loads((tmp_path / "a" / "config.json").read_text())["quantization_config"]
    assert "model.layers.1.mlp.odd_proj" in qc["modules_to_not_convert"]


def _rewrite(out: Path, edit) -> None:
    """Apply edit(tensors) to every shard of `out`, keeping the metadata and the index."""
    index = json.loads((out / "model.safetensors.index.json").read_text())
    for shard in sorted(out.glob("*.safetensors")):
        meta = _safetensors.SafetensorsFile(shard).metadata
        t = _safetensors.load_file(shard)
        edit(t)
        _safetensors.save_file(t, shard, meta)
        for name in t:
            index["weight_map"].setdefault(name, shard.name)
    (out / "model.safetensors.index.json").write_text(json.dumps(index))


def _edit_config(out: Path, edit) -> None:
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg["quantization_config"])
    (out / "config.json").write_text(json.dumps(cfg))


M = "model.layers.0.self_attn.q_proj."


def _drop(name):
    return lambda t: t.pop(name, None)


def _reshape(name, shape):
    def edit(t):
        if name in t:
            t[name] = np.ascontiguousarray(t[name].reshape(-1)[: int(np.prod(shape))]).reshape(shape)
    return edit


def _scale_by(name, factor):
    def edit(t):
        if name in t:
            t[name] = t[name] * np.float32(factor)
    return edit


def _retype(name, dtype):
    def edit(t):
        if name in t:
            t[name] = t[name].astype(dtype)
    return edit


BAD_INPUTS = [
    # (format, damage to the tensors, damage to the config, words of the one line)
    ("W4A16", None, lambda qc: qc.update(quant_method="gptq"),
     ["quant_method 'gptq'", "does not read"]),
    ("W4A16", None, lambda qc: qc.update(quant_method="bitsandbytes"),
     ["'bitsandbytes'", "does not read"]),
    ("W4A16", None, lambda qc: qc.pop("config_groups"), ["no config_groups"]),
    ("W4A16", None, lambda qc: qc.update(quantization_status="frozen"),
     ["quantization_status", "'frozen'"]),
    ("W4A16", None, lambda qc: qc["config_groups"]["group_0"].update(format="marlin-24"),
     ["'marlin-24'", "does not read"]),
    ("W4A16", None, lambda qc: qc["config_groups"]["group_0"]["weights"].update(group_size=100),
     ["group_size 100", "does not divide K=256", "weight_packed"]),
    ("W4A16", None, lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits=2),
     ["2 bits"]),
    ("W4A16", _drop(M + "weight_scale"), None, [M + "weight_scale", "missing"]),
    ("W4A16", _drop(M + "weight_shape"), None, [M + "weight_shape", "missing"]),
    ("W4A16", _reshape(M + "weight_scale", (256, 1)), None,
     [M + "weight_scale", "shape [256, 1]", "expected [256, 2]"]),
    ("W4A16", _reshape(M + "weight_packed", (128, 32)), None,
     [M + "weight_packed", "shape [128, 32]", "expected [256, 32]"]),
    ("W4A16", _retype(M + "weight_scale", np.float32), None,
     [M + "weight_scale", "dtype F32"]),
    ("W4A16_ASYM", _drop(M + "weight_zero_point"), None, [M + "weight_zero_point", "missing"]),
    ("W4A16_ASYM", _reshape(M + "weight_zero_point", (16, 2)), None,
     [M + "weight_zero_point", "expected [32, 2]"]),
    ("W8A8", _retype(M + "weight_scale", np.int32), None, [M + "weight_scale", "dtype I32"]),
    ("W8A8", _reshape(M + "weight_scale", (128, 1)), None, [M + "weight_scale", "[256, 1]"]),
    ("AWQ", _drop(M + "qzeros"), None, [M + "qzeros", "missing"]),
    ("AWQ", _reshape(M + "scales", (1, 256)), None, [M + "scales", "expected [2, 256]"]),
    ("AWQ", None, lambda qc: qc.update(version="gemv"), ["AWQ version 'gemv'"]),
    ("AWQ", None, lambda qc: qc.update(bits=8), ["AWQ with 8 bits"]),
    ("NVFP4", _drop(M + "weight_global_scale"), None, [M + "weight_global_scale", "missing"]),
    ("NVFP4", _scale_by(M + "weight_global_scale", 0), None,
     [M + "weight_global_scale", "global scale 0.0", "positive finite"]),
    ("NVFP4", _retype(M + "weight_global_scale", np.float16), None,
     [M + "weight_global_scale", "dtype F16", "expected F32"]),
    ("NVFP4", _retype(M + "weight_scale", np.float32), None,
     [M + "weight_scale", "dtype F32", "expected F8_E4M3"]),
    ("NVFP4", _reshape(M + "weight_scale", (256, 8)), None,
     [M + "weight_scale", "shape [256, 8]", "expected [256, 16]"]),
    ("NVFP4", None, lambda qc: qc["config_groups"]["group_0"]["weights"].update(symmetric=False),
     ["nvfp4-pack-quantized", "symmetric False"]),
    ("MXFP4", _retype(M + "weight_scale", np.int8), None,
     [M + "weight_scale", "dtype I8", "expected U8"]),
    ("MXFP4", _reshape(M + "weight_packed", (256, 100)), None,
     [M + "weight_packed", "K=200 is not a multiple of the MXFP4 block of 32"]),
    ("MXFP4", None, lambda qc: qc["config_groups"]["group_0"]["weights"].update(group_size=16),
     ["mxfp4-pack-quantized", "group_size 32", "group_size 16"]),
]


@pytest.mark.parametrize("fmt,tensors,config,words", BAD_INPUTS,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_INPUTS)])
def test_dequantize_refuses_bad_input(model, tmp_path, capsys, fmt, tensors, config, words):
    q, back = tmp_path / "q", tmp_path / "back"
    assert main(["quantize", str(model), str(q), "-f", fmt, "--device", "cpu", "-q"]) == 0
    if tensors is not None:
        _rewrite(q, tensors)
    if config is not None:
        _edit_config(q, config)
    capsys.readouterr()
    assert main(["dequantize", str(q), str(back), "--device", "cpu"]) == 1
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith("cuquant: error:")
    assert all(w in err for w in words), err
    assert not back.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model", "q"]
    assert main(["inspect", str(q)]) == 1


@pytest.mark.parametrize("fmt,codes", [("W4A16", "weight_packed"), ("W8A8", "weight"),
                                       ("FP8_DYNAMIC", "weight"), ("AWQ", "qweight"),
                                       ("NVFP4", "weight_packed")])
def test_codes_without_their_config_are_refused(model, tmp_path, capsys, fmt, codes):
    q = tmp_path / "q"
    assert main(["quantize", str(model), str(q), "-f", fmt, "--device", "cpu", "-q"]) == 0
    (q / "config.json").unlink()
    capsys.readouterr()
    assert main(["dequantize", str(q), str(tmp_path / "back"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f".{codes}'" in err and "no quantization_config" in err
    assert not (tmp_path / "back").exists()


def test_old_cuquant_checkpoints_still_dequantize(model, tmp_path, capsys):
    """Checkpoints written before the command took the engines' formats (quant_method
    "cuquant"): Python still writes them, the command reads them."""
    for fmt in ckpt.LEGACY_FORMATS:
        q = tmp_path / fmt
        ckpt.quantize_checkpoint(model, q, fmt, device="cpu")
        assert json.loads((q / "config.json").read_text())["quantization_config"][
            "quant_method"] == "cuquant"
        assert main(["inspect", str(q)]) == 0
        assert f"{fmt} codes" in capsys.readouterr().out
        assert main(["dequantize", str(q), str(tmp_path / (fmt + "-back")), "-q"]) == 0
        assert set(load_dir(tmp_path / (fmt + "-back"))) == set(load_dir(model))
    rc, _, err = run_cli("quantize", model, tmp_path / "x", "-f", "int8-channel")
    _refused(rc, err, "invalid choice", "int8-channel")
