"""How fast the device writes when it mostly writes: the ceiling of write-heavy kernels
such as the 4-bit dequantizers (half a byte read for every two written), measured against
the copy bandwidth that SPEC section 8 counts in (bytes read plus written), cold L2.

- memset: `cudaMemsetAsync` of N bytes (writes only);
- fill: CuPy's `fill` of a float16 array (a kernel that writes only);
- copy: `copyto` of N bytes (read N, write N), the reference.

    python -m benchmarks.write_ceiling [--mib 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse


def main():
    p = argparse.ArgumentParser(prog="python -m benchmarks.write_ceiling")
    p.add_argument("--mib", type=int, default=1024, help="bytes written, in MiB")
    p.add_argument("--rounds", type=int, default=3)
    opts = p.parse_args()
    import cupy as cp

    from . import harness

    nbytes = opts.mib << 20
    timer = harness.Timer()
    dst = cp.empty(nbytes // 2, dtype=cp.float16)
    src = cp.ones_like(dst)
    stream = cp.cuda.get_current_stream()
    cases = {
        "memset": lambda: cp.cuda.runtime.memsetAsync(dst.data.ptr, 0, nbytes, stream.ptr),
        "fill": lambda: dst.fill(1.0),
        "copy": lambda: cp.copyto(dst, src),
    }
    moved = {"memset": nbytes, "fill": nbytes, "copy": 2 * nbytes}
    for r in range(opts.rounds):
        copy_bw = harness.copy_bandwidth(timer)
        cells = []
        for name, fn in cases.items():
            ms = timer.time_ms(fn, reps=20)
            cells.append(f"{name} {moved[name] / (ms * 1e-3) / 1e12:.3f} TB/s "
                         f"({moved[name] / (ms * 1e-3) / copy_bw:.3f} x copy)")
        print(f"round {r}: copy {copy_bw / 1e12:.3f} TB/s | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
