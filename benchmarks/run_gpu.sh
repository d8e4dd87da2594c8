#!/usr/bin/env bash
# Runs the GPU test suite and then the benchmark on a CUDA machine, from the repository
# root, without installing (PYTHONPATH=.). Logs and results go to the folder given first
# (default benchmarks/results); the other arguments go to the benchmark.
#   bash benchmarks/run_gpu.sh benchmarks/results --quick
set -u
out=${1:-benchmarks/results}
shift || true
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
} > "$out/gpu-env.txt" 2>&1
python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 -rfE 2>&1 | tee "$out/gpu-tests.log" | tail -n 30
python3 -m benchmarks --out "$out" "$@" 2>&1 | tee "$out/bench.log" | tail -n 5
