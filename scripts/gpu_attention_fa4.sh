#!/usr/bin/env bash
# Our attention kernels and FlexAttention with its FlashAttention-4 backend, in one device
# call, on the same shapes: bench_attention (ours, fast and deterministic, with cuDNN's
# causal forward in the same process), then the anchor (BACKENDS=FLASH, one process per
# shape). Needs the FA4 wheels installed on the warm machine (../shared/anchors/README.md:
# two calls before this one) and the anchor in ANCHORS (../shared/anchors/anchor_fa4.py
# with scripts/anchor_fa4_gqa.patch: H, KV and D from the environment, GQA). Here:
#   mkdir -p .device/anchors && cp ../shared/anchors/anchor_fa4.py .device/anchors/ &&
#   patch -s .device/anchors/anchor_fa4.py scripts/anchor_fa4_gqa.patch
# Then on the device, carrying the bundle and ANCHORS:
#   BIN=.device/r/main ANCHORS=.device/anchors bash scripts/gpu_attention_fa4.sh mha|gqa
# mha: H=16 D=128 at S 4096 16384 32768; gqa: H=12 KV=4 D=64 and H=32 KV=8 D=128 at 8192.
# Output: $OUT/fa4_<set>.log (ours' table, then one JSON line per anchor row).
set -u
bin=${BIN:?BIN: the bundle with bench_attention}; anchors=${ANCHORS:?ANCHORS: the anchor folder}
log=${OUT:-/tmp}/fa4_${1:?mha or gqa}.log
export LD_LIBRARY_PATH=$PWD/$bin:${LD_LIBRARY_PATH:-}
export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; } | tee "$log"
case "$1" in
  mha) shapes=("16 16 128 4096 16384 32768") ;;
  gqa) shapes=("12 4 64 8192" "32 8 128 8192") ;;
  *) echo "unknown set $1 (mha or gqa)" >&2; exit 2 ;;
esac
for shape in "${shapes[@]}"; do
  read -r h kv d lens <<< "$shape"
  echo "== ours H=$h KV=$kv D=$d S=$lens" | tee -a "$log"
  timeout 200 "$bin/bench_attention" --heads "$h" --kv-heads "$kv" --head-dim "$d" $lens 2>&1 | tee -a "$log"
done
for shape in "${shapes[@]}"; do
  read -r h kv d lens <<< "$shape"
  echo "== flex+fa4 H=$h KV=$kv D=$d S=$lens" | tee -a "$log"
  H=$h KV=$kv D=$d BACKENDS=FLASH PYTHONUNBUFFERED=1 timeout 280 python3 "$anchors/anchor_fa4.py" $lens 2>&1 |
    grep -E '^\{|Error|error' | tee -a "$log"
done
