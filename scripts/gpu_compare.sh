#!/usr/bin/env bash
# A/B timing in one device call: bench_attention and bench_trainer of two bundles
# (e.g. the commit before a refactor and after it), alternated twice so drift and
# noise show up as the spread within each side. Usage on the device:
#   bash scripts/gpu_compare.sh BEFORE_DIR AFTER_DIR
# Each DIR holds bench_attention and bench_trainer and their libraries
# (scripts/device_bundle.sh BUILD DIR bench_attention bench_trainer); the libraries are
# taken from AFTER_DIR only, so BEFORE_DIR may hold just the two binaries. Logs to $OUT.
set -u
before=$1; after=$2
out=${OUT:-/tmp/compare_out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$out/compare_info.log"
export LD_LIBRARY_PATH=$PWD/$after  # one copy of the shared libraries: the after bundle's
for round in 1 2; do
    for side in before after; do
        dir=${!side}
        timeout 120 $dir/bench_attention 4096 16384 > "$out/attn_${side}_$round.log" 2>&1
        echo "== bench_attention $side round $round rc=$?"
        tail -9 "$out/attn_${side}_$round.log"
        for c in small tinyllama; do
            timeout 150 $dir/bench_trainer --config configs/bench_$c.json 2>&1 |
                grep '^{' | tee -a "$out/trainer_${side}.log"
        done
    done
done
