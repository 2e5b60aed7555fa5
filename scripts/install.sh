#!/usr/bin/env bash
# Installs the Debian build dependencies (when missing) and builds onepass into build/.
# CUDA targets build too when nvcc is on PATH (or in /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(build-essential cmake pkg-config libsentencepiece-dev sentencepiece libjansson-dev
          libpcre2-dev libutf8proc-dev libopenblas-dev gnuplot-nox libcairo2-dev fonts-dejavu-core)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
build_dir="${BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
echo "built into $build_dir/"
