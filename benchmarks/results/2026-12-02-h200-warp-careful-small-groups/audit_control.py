"""The twentieth round's failing build (the zero point's staged kernels with seeded
rounding's own format, ZeroPoint<8, ZP_PHILOX>) through benchmarks.sass_audit under one
NVRTC, with groups.cuh as it was (a folder holding head's cuda_src) and as committed.
From the repository root: python audit_control.py LIBNVRTC HEAD_CUDA_SRC."""
import os, pathlib, sys, tempfile
sys.path.insert(0, os.getcwd())
from benchmarks import sass_audit
from cuquant import _kernels

library, head = sys.argv[1], pathlib.Path(sys.argv[2]).resolve()
exprs = [f"cq::quantize_groups_staged<cq::ZeroPoint<8, 2>, {t}, {team}, 4, 0>"
         for t in ("cq::half", "cq::bfloat16") for team in (2, 64, 128, 256)]
_kernels.all_specializations = lambda: {"zero_point.cu": exprs}
shipped = _kernels.source_dir
tool = sass_audit._cuobjdump()
for name, folder in (("head", lambda: head), ("committed", shipped)):
    _kernels.source_dir = folder
    _kernels.source.cache_clear()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        for src, cubin in sass_audit.cubins("sm_90", ["zero_point.cu"], library):
            open(path, "wb").write(cubin)
            listing = sass_audit.parse_listing(sass_audit.listing_of(tool, path))
            flagged = [fn for fn, ins in listing.items() if sass_audit.hazards(ins)]
            print(f"{name}: {len(listing)} kernels, {len(flagged)} flagged "
                  f"(NVRTC {sass_audit.nvrtc_version(library)})")
