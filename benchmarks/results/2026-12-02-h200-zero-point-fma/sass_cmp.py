"""Compare sm_90 SASS of groupwise.cu and zero_point.cu between two source folders.
usage: sass_cmp.py LIB DIR_A DIR_B"""
import os, pathlib, sys, tempfile, re
sys.path.insert(0, os.getcwd())
from cuquant import _kernels
from benchmarks import sass_audit

lib, a, b = sys.argv[1:4]
tool = sass_audit._cuobjdump()

def snap(folder):
    _kernels.source_dir = lambda: pathlib.Path(folder)
    _kernels.source.cache_clear()
    out = {}
    for src, img in sass_audit.cubins("sm_90", ["groupwise.cu", "zero_point.cu"], lib):
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(img)
        for name, ins in sass_audit.parse_listing(sass_audit.listing_of(tool, f.name)).items():
            out[name] = [re.sub(r"/\*[0-9a-f]+\*/", "", i).strip() for _, i in ins]
        os.unlink(f.name)
    return out

A, B = snap(a), snap(b)
same = [n for n in A if A.get(n) == B.get(n)]
diff = [n for n in A if n in B and A[n] != B[n]]
print(f"{len(A)} / {len(B)} functions, {len(same)} identical, {len(diff)} differ, "
      f"{len(set(A) ^ set(B))} in one only")
for n in diff:
    print(f"  {n[:110]}  {len(A[n])} -> {len(B[n])} instructions")
