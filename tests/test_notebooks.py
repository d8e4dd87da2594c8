"""The notebooks of notebooks/ run top to bottom on the CPU, as a newcomer would run them.

Each notebook is executed with nbclient in a fresh kernel (this interpreter), from the
notebooks folder, with the checkout first on PYTHONPATH; any cell error fails the test, and
so does a notebook that runs past its time limit (CUQUANT_NOTEBOOK_TIMEOUT seconds, 240 by
default; each takes well under a minute on two cores). CUQUANT_NOTEBOOK_SAVE=DIR keeps the
executed copies there. Cells that need a GPU, PyTorch or JAX
skip themselves when those are absent. The notebooks are edited as notebooks (in Jupyter or
any editor) and committed executed, with their outputs and plots, so that they read on
GitHub; this test executes them again.
"""

from __future__ import annotations

import asyncio
import csv
import importlib.util
import json
import os
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]-*.ipynb"))
PERFORMANCE = NOTEBOOK_DIR / "04-performance.ipynb"
TIMEOUT = float(os.environ.get("CUQUANT_NOTEBOOK_TIMEOUT", "240"))

HAVE_RUNNER = all(importlib.util.find_spec(m) is not None for m in ("nbclient", "ipykernel"))
needs_runner = pytest.mark.skipif(
    not HAVE_RUNNER, reason="executing notebooks needs nbclient and ipykernel "
                            "(pip install nbclient ipykernel, part of the test extra)")


def _ids(paths):
    return [p.stem for p in paths]


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"01-quickstart.ipynb", "02-formats-and-error.ipynb", "03-interop.ipynb",
            "04-performance.ipynb"} <= names


@needs_runner
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_executed(path):
    """Every code cell ran, in order, top to bottom (execution counts 1, 2, ...)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    counts = [cell.execution_count for cell in nb.cells if cell.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: not executed top to bottom (execution counts {counts}); run "
        f"CUQUANT_NOTEBOOK_SAVE=DIR python -m pytest tests/test_notebooks.py and commit the "
        f"executed copy")
    assert any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), path.name


# ---------------------------------------------------------------------------------------
# Execution

def _execute(path: Path, monkeypatch, results_dir: Path | None = None):
    """Run the notebook in a fresh kernel from the notebooks folder; return it with its
    outputs and the seconds it took."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    if results_dir is None:
        monkeypatch.delenv("CUQUANT_BENCH_RESULTS", raising=False)
    else:
        monkeypatch.setenv("CUQUANT_BENCH_RESULTS", str(results_dir))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=int(TIMEOUT), kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    start = time.perf_counter()
    try:
        asyncio.run(asyncio.wait_for(client.async_execute(), TIMEOUT))
    except asyncio.TimeoutError:
        pytest.fail(f"{path.name} ran past {TIMEOUT:.0f} s (CUQUANT_NOTEBOOK_TIMEOUT)")
    seconds = time.perf_counter() - start
    print(f"{path.name}: {seconds:.1f} s")
    save = os.environ.get("CUQUANT_NOTEBOOK_SAVE")  # keep the executed copy (e.g. a GPU run)
    if save and results_dir is None:
        Path(save).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, Path(save) / path.name)
    return nb, seconds


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif "text/plain" in out.get("data", {}):
                parts.append(out.data["text/plain"])
    return "\n".join(parts)


def _images(nb) -> int:
    return sum("image/png" in out.get("data", {})
               for cell in nb.cells for out in cell.get("outputs", []))


def _check_outputs(nb, name: str) -> str:
    text = _text(nb)
    assert "Traceback" not in text, f"{name} printed a traceback:\n{text}"
    # Every check a notebook prints ("bit-identical to NumPy: True", ...) must hold; labels
    # such as "symmetric=False" are not checks.
    failed = [line for line in text.splitlines() if re.search(r":\s*False\b", line)]
    assert not failed, f"{name}: a printed check failed:\n" + "\n".join(failed)
    return text


@needs_runner
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path, monkeypatch):
    nb, _ = _execute(path, monkeypatch)
    text = _check_outputs(nb, path.name)
    if path.name.startswith("01"):
        assert "codes identical:  True" in text
        assert "unpacked by hand == dequantize_int4_per_group: True" in text
    if path.name.startswith("02"):
        assert _images(nb) >= 5, "02 should draw its five figures"
        assert "tile SQNR" in text


def _write_run(folder: Path, date: str, rows) -> Path:
    """One run as the benchmark writes it: benchmark.csv, and benchmark.md whose
    environment block carries the run's date."""
    folder.mkdir(parents=True)
    (folder / "benchmark.md").write_text(
        f'# cuquant benchmark\n\n```\n{{\n "date": "{date}"\n}}\n```\n', encoding="utf-8")
    path = folder / "benchmark.csv"
    keys = sorted({k for r in rows for k in r}) or ["op", "variant"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _sample_results(folder: Path) -> Path:
    """Small results in the benchmark's layout, one folder per GPU: the newest run has two
    kernels at three sizes, one with a variant, baselines partly missing, and one failed
    row; an older run on another GPU, written later, must not be the one plotted."""
    copy_tbps = 4.0
    rows = []
    for op, variant, target in (("quantize_int8_per_channel", "", 0.92),
                                ("dequantize_fp8_per_token_group", '{"group_size": 128}', 0.93)):
        for shape, frac in (("1x4096", 0.001), ("128x7168", 0.12), ("16384x7168", 0.9)):
            m, k = (int(d) for d in shape.split("x"))
            moved = 3 * m * k
            tbps = frac * copy_tbps
            rows.append({"op": op, "variant": variant, "dtype": "bfloat16", "shape": shape,
                         "us": moved / (tbps * 1e12) * 1e6, "bytes": moved,
                         "logical_bytes": moved, "tbps": tbps, "frac_copy": frac,
                         "target": target, "host_us": 25.0 if m < 1000 else "",
                         "eager_frac": frac / 10, "compile_frac": frac / 2 if m > 1000 else "",
                         "cupy_frac": "", "error": ""})
    rows.append({"op": "quantize_fp8_per_block", "variant": "", "dtype": "bfloat16",
                 "shape": "16384x7168", "error": "RuntimeError: out of memory"})
    path = _write_run(folder / "h200", "2030-01-01 12:00 UTC", rows)
    _write_run(folder / "a100", "2029-12-31 09:00 UTC", [])
    return path


@needs_runner
def test_performance_notebook_plots_results(tmp_path, monkeypatch):
    path = _sample_results(tmp_path)
    nb, _ = _execute(PERFORMANCE, monkeypatch, results_dir=tmp_path)
    text = _check_outputs(nb, PERFORMANCE.name)
    assert f"results: {path}" in text
    assert "device copy bandwidth: 4.000 TB/s" in text
    assert "dequantize_fp8_per_token_group group_size=128" in text
    assert "quantize_fp8_per_block 16384x7168: RuntimeError: out of memory" in text
    assert "Skipped" not in text
    assert _images(nb) == 4


@needs_runner
def test_performance_notebook_without_results(tmp_path, monkeypatch):
    nb, _ = _execute(PERFORMANCE, monkeypatch, results_dir=tmp_path)
    text = _check_outputs(nb, PERFORMANCE.name)
    assert "No benchmark results found" in text
    assert _images(nb) == 0


def test_readme_lists_every_notebook():
    readme = (NOTEBOOK_DIR / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert path.name in readme, f"notebooks/README.md does not mention {path.name}"


def test_notebook_json_is_plain():
    """Committed notebooks are plain JSON of a modest size (their plots included)."""
    for path in NOTEBOOKS:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["nbformat"] == 4
        assert path.stat().st_size < 4_000_000, f"{path.name} is unexpectedly large"
