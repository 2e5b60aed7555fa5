#!/usr/bin/env bash
# One device call that checks and times two attention bundles, A (the branch's kernels)
# and B (a kernel change): test_attention_cuda of both (in parallel: the CPU oracle is
# the slow part) with racecheck of B's quick cases beside them, then bench_attention of
# A and B alternated (the full default table, then the D=64 GQA shape once more), each
# with cuDNN's SDPA forward on the causal row. Usage on the device, carry [".device"]:
#   bash scripts/gpu_attention_ab.sh .device/kern/base .device/kern/fwd3
# Each DIR: scripts/device_bundle.sh build DIR bench_attention test_attention_cuda
# (then strip --strip-debug the two binaries). Logs to $OUT.
set -u
a=$1; b=$2
out=${OUT:-/tmp/attn_ab_out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$b:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  ldconfig -p | grep -m1 'libcudnn.so.9 '; } | tee "$out/info.log"

timeout 200 $a/test_attention_cuda > "$out/test_a.log" 2>&1 & pid_a=$!
timeout 200 $b/test_attention_cuda > "$out/test_b.log" 2>&1 & pid_b=$!
ATTN_TEST_QUICK=1 timeout 200 compute-sanitizer --tool racecheck --racecheck-report all $b/test_attention_cuda \
  > "$out/racecheck_b.log" 2>&1 & pid_r=$!
wait $pid_a; echo "test A rc=$?"; grep -E "FAIL|passed|failed" "$out/test_a.log" | tail -3
wait $pid_b; echo "test B rc=$?"; grep -E "FAIL|passed|failed" "$out/test_b.log" | tail -3
wait $pid_r; echo "racecheck B rc=$?"; tail -2 "$out/racecheck_b.log"

for side in a b; do
  timeout 150 ${!side}/bench_attention > "$out/bench_$side.log" 2>&1
  echo "== bench $side (${!side}) rc=$?"; cat "$out/bench_$side.log"
done
for side in a b; do
  timeout 60 ${!side}/bench_attention --heads 12 --kv-heads 4 --head-dim 64 8192 16384 2>&1 |
    tee "$out/bench_d64_$side.log" | sed "s|^|$side: |" | grep -v device
done
