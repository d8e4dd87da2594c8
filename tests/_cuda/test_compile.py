"""Every kernel specialization the library can launch compiles with NVRTC for sm_80,
sm_89 and sm_90, with the options CuPy uses (-ftz=true included). NVRTC needs no GPU."""

import pytest

from cuquant._cuda import compile as _kernels
from cuquant._cuda import symmetric as _symmetric

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


def test_smooth_threads_are_the_kernels_launch_bounds():
    """The host launches smooth_quant_rows with smooth_threads(tpg, vpt) threads; the kernel
    sizes its teams, tables and row stride from SmoothShape's, its launch bound. One
    specialization a geometry (the rule depends on nothing else), read from the PTX."""
    import re

    exprs = {}
    for e in _kernels.all_specializations()["symmetric.cu"]:
        m = re.fullmatch(r"cq::smooth_quant_rows<cq::half, 8, (\d+), (\d+), (true|false)>", e)
        if m:
            exprs.setdefault((int(m[1]), int(m[2])), e)
    assert {(1024, 4), (128, 7), (128, 4), (32, 7)} <= set(exprs)
    checked = 0
    for _, part, prog in _kernels.programs("sm_90", {"symmetric.cu": list(exprs.values())}):
        ptx = nvrtc.getPTX(prog)
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        bound = dict(re.findall(r"\.entry (\S+)\([^{]*?\.maxntid (\d+)", ptx, re.S))
        for (tpg, vpt), e in exprs.items():
            want = _symmetric.smooth_threads(tpg, vpt)
            assert int(bound[nvrtc.getLoweredName(prog, e)]) == want, (e, want)
            checked += 1
    assert checked == len(exprs)
