#!/usr/bin/env bash
# One device call that checks and times attention bundles: A (the branch's kernels) and
# one or more kernel changes B, C, ... test_attention_cuda of every bundle and racecheck
# of the quick cases of every bundle but A, all in parallel (the CPU oracle is the slow
# part), then bench_attention of each in turn (the full default table, then the D=64 GQA
# shape at S=8192 and 16384), each with cuDNN's SDPA forward on the causal row. Usage on
# the device, carry [".device/kern"]:
#   bash scripts/gpu_attention_ab.sh .device/kern/base .device/kern/new [...]
# Each DIR: scripts/device_bundle.sh build DIR bench_attention test_attention_cuda
# (then strip --strip-debug the two binaries). Logs to $OUT: info.log and one log per
# bundle (side_<n>.log: test, racecheck, benches), at most 7 bundles.
set -u
out=${OUT:-/tmp/attn_ab_out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$1:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  ldconfig -p | grep -m1 'libcudnn.so.9 '; } | tee "$out/info.log"

n=0; pids=()
for dir in "$@"; do
  log=$out/side_$n.log
  echo "== $dir" > "$log"
  { timeout 200 $dir/test_attention_cuda > "$log.test" 2>&1; echo "test rc=$?" >> "$log.test"; } &
  pids+=($!)
  if [ $n -gt 0 ]; then
    { ATTN_TEST_QUICK=1 timeout 200 compute-sanitizer --error-exitcode 1 --tool racecheck --racecheck-report all \
        $dir/test_attention_cuda > "$log.race" 2>&1; echo "racecheck rc=$?" >> "$log.race"; } &
    pids+=($!)
  fi
  n=$((n + 1))
done
wait "${pids[@]}"
n=0
for dir in "$@"; do
  log=$out/side_$n.log
  for f in "$log.test" "$log.race"; do [ -f "$f" ] && { cat "$f" >> "$log"; rm "$f"; }; done
  echo "== $dir: $(grep -E 'passed|rc=|RACECHECK SUMMARY' "$log" | tr '\n' ' ')"
  n=$((n + 1))
done
n=0
for dir in "$@"; do
  log=$out/side_$n.log
  echo "== bench $dir" | tee -a "$log"
  timeout 150 $dir/bench_attention 2>&1 | tee -a "$log" | grep -vE '^device|^ +S mask' | sed 's/ (max.*//'
  timeout 60 $dir/bench_attention --heads 12 --kv-heads 4 --head-dim 64 8192 16384 2>&1 | tee -a "$log" |
    grep -vE '^device|^ +S mask' | sed 's/ (max.*//'
  n=$((n + 1))
done
