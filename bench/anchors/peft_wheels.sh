#!/usr/bin/env bash
# Downloads, here, the wheels that bench/anchors/peft_trainer.py needs beyond a PyTorch +
# transformers install, for the GPU machine (Python 3.12, x86-64, no internet): peft,
# accelerate (peft imports it) and psutil (both need it; a small abi3 wheel). Together
# about 1 MB, so they travel in the benchmark call's carry; bench/run_gpu.sh lora installs
# them into a site folder on PYTHONPATH when DIR is carried:
#   bash bench/anchors/peft_wheels.sh [DIR]        (DIR: .peft, git-ignored)
# PEFT_VERSION and ACCELERATE_VERSION pin other versions (peft 0.21.2 runs on transformers
# 4.x and 5.x alike).
set -euo pipefail
dir=${1:-.peft}
mkdir -p "$dir"
rm -f "$dir"/*.whl
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for p in "peft==${PEFT_VERSION:-0.21.2}" "accelerate==${ACCELERATE_VERSION:-1.16.0}" "psutil==7.2.2"; do
    python3 -m pip download -q --no-deps "${plat[@]}" -d "$dir" "$p"
done
ls "$dir"
du -sh "$dir"
