#!/usr/bin/env bash
# The prepared GPU benchmark: run once on a machine with one CUDA GPU (installs nothing beyond the project;
# under 8 minutes). Writes benchmarks_gpu.json and the "On a GPU" section of BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# the project only: its dependencies (torch, transformers, diffusers, triton...) must already be there
python -c "import mmspec" 2>/dev/null || pip install -q --no-deps --no-build-isolation -e .
exec python examples/gpu_bench.py "$@"
