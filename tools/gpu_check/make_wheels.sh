#!/usr/bin/env bash
# Builds on a machine with network what run.sh installs on a GPU machine that has none: TRL and the packages its
# image lacks (its torch with CUDA, transformers 5.x, peft, accelerate, pyarrow and pandas are used as they are),
# pytest, and trl_compat's wheel from this checkout. One folder a stack, a pip --target site each on the GPU
# machine. build/ is git-ignored: carry build/gpu-wheels (under 64 MiB).
#   bash tools/gpu_check/make_wheels.sh            then run.sh on the GPU machine (matrix/README.md, "On a GPU")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W="$ROOT/build/gpu-wheels"
rm -rf "$W"
dl() {  # folder python-version requirement...
  local dir=$1 py=$2; shift 2; mkdir -p "$W/$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --disable-pip-version-check -d "$W/$dir" "$@"
}
# the suite (tests/gpu): each TRL over the image's transformers 5.x; datasets and its pins as the prepared check had them
dl trl0.22.1 3.12 trl==0.22.1
dl trl0.24.0 3.12 trl==0.24.0
dl trl1.9.2 3.12 trl==1.9.2
dl trl1.16.0 3.12 trl==1.16.0
dl suite_common 3.12 datasets==4.8.5 dill==0.4.1 fsspec==2026.2.0 multiprocess==0.70.19 \
   pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 Pygments==2.21.0
# logits-to-keep's benchmark: TRL 0.15.2 on transformers 4.48.3 (the bug) and 4.50.3 (native), their own stack
dl bench_common 3.12 trl==0.15.2 tokenizers==0.21.4 huggingface_hub==0.36.2 datasets==3.2.0 dill==0.3.8 \
   multiprocess==0.70.16 fsspec==2024.9.0 peft==0.14.0 accelerate==1.3.0
dl bench_tf4.48.3 3.12 transformers==4.48.3
dl bench_tf4.50.3 3.12 transformers==4.50.3
# multiprocess's wheels are per Python version: the CPU dry run's too (run.sh installs the running Python's only)
for py in 3.11 3.13; do
  dl suite_common "$py" multiprocess==0.70.19
  dl bench_common "$py" multiprocess==0.70.16
done
python3 -m pip wheel -q --no-deps --disable-pip-version-check -w "$W/trl_compat" "$ROOT"
size=$(du -sm "$W" | cut -f1)
echo "build/gpu-wheels: ${size} MiB"
[ "$size" -lt 64 ] || { echo "over the 64 MiB a call may carry" >&2; exit 1; }
