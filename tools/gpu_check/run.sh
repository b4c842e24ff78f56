#!/usr/bin/env bash
# The GPU suite on a lent machine (matrix/README.md, "On a GPU"): carry build/gpu-wheels (make_wheels.sh), then
#   bash tools/gpu_check/run.sh                 results under $OUT; without CUDA it says so and exits 0
#   bash tools/gpu_check/run.sh --cpu-dry-run   the same on the CPU in float32 (PYTHON= a venv with torch, transformers, peft)
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
PY="${PYTHON:-python3}"
exec "$PY" tools/gpu_check/runner.py --python "$PY" "$@"
