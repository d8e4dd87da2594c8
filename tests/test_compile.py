"""Every kernel specialization the library can launch compiles with NVRTC for sm_80,
sm_89 and sm_90, with the options CuPy uses (-ftz=true included). NVRTC needs no GPU."""

import pytest

from cuquant import _kernels

nvrtc = pytest.importorskip(
    "cupy_backends.cuda.libs.nvrtc", reason="NVRTC comes with the cuda12 / cuda13 extra")


def test_specializations_are_listed():
    table = _kernels.all_specializations()
    assert set(table) >= {"symmetric.cu"}
    for src, exprs in table.items():
        assert exprs, src
        assert len(exprs) == len(set(exprs)), f"{src} lists a specialization twice"


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_every_specialization_compiles(arch):
    counts = _kernels.compile_all(arch)
    assert counts == {src: len(e) for src, e in _kernels.all_specializations().items()}
