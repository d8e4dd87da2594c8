#!/usr/bin/env bash
# Runs the GPU test suite and then the benchmark on a CUDA machine, from the repository
# root, without installing (PYTHONPATH=.). The benchmark writes its table, CSV and plot into
# benchmarks/results/<gpu>/, replacing the previous run on that GPU; the environment and the
# logs of both go to the folder given first (default: a folder under $TMPDIR, outside the
# repository). The other arguments go to the benchmark.
#   bash benchmarks/run_gpu.sh /tmp/gpu-run --quick
set -u
logs=${1:-${TMPDIR:-/tmp}/cuquant-gpu-run}
shift || true
mkdir -p "$logs"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
} > "$logs/gpu-env.txt" 2>&1
python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 -rfE 2>&1 | tee "$logs/gpu-tests.log" | tail -n 30
python3 -m benchmarks "$@" 2>&1 | tee "$logs/bench.log" | tail -n 5
echo "logs in $logs"
