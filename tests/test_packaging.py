"""The wheel carries the CUDA sources inside the package and works installed outside the
checkout: the loader finds the sources through importlib.resources and an op runs."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                    str(ROOT)], check=True)
    (whl,) = out.glob("cuquant-*.whl")
    return whl


def test_wheel_carries_cuda_sources(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    prefix = "cuquant/cuda_src/"
    sources = {n[len(prefix):] for n in names if n.startswith(prefix) and not n.endswith("/")}
    folder = ROOT / "cuda_src"
    assert sources == {p.relative_to(folder).as_posix() for p in folder.rglob("*")
                       if p.suffix in (".cu", ".cuh")}
    assert not any(n.startswith("cuda_src/") for n in names)


def test_wheel_carries_no_tables_of_tests(wheel):
    """The op table, the tests and the benchmark are the repository's, not the package's:
    none of them is importable from an installed wheel."""
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"cuquant"}
    assert not any(n.startswith("cuquant/testing") for n in zipfile.ZipFile(wheel).namelist())


def test_wheel_carries_the_license(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    (lic,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    text = zipfile.ZipFile(wheel).read(lic).decode()
    assert text.startswith((ROOT / "LICENSE").read_text()[:200]) and "Version 2.0" in text


def test_installed_wheel_works_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import cuquant, numpy as np\n"
        "from cuquant._cuda import kernels as _kernels\n"
        "d = _kernels.source_dir()\n"
        "assert 'site' in str(d) and d.joinpath('symmetric.cu').is_file(), d\n"
        "for src in ('symmetric.cu', 'groupwise.cu', 'zero_point.cu'):\n"
        "    assert '#include' not in _kernels.source(src), src\n"
        "q, s = cuquant.quantize_int8_per_channel(np.ones((2, 4), np.float32))\n"
        "assert q.tolist() == [[127] * 4] * 2\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
