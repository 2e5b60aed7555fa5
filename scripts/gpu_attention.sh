#!/usr/bin/env bash
# One device call for the CUDA attention: correctness test, compute-sanitizer memcheck
# and racecheck on a small case, the benchmark, and (with --anchor) FlexAttention's
# anchor timings in the same call. Expects the binaries and the libraries they need in
# .device/attn/bin (built here, carried) and anchor_attention.py in .device/attn/. Logs to $OUT.
# Prepare (on the build machine, from the repo root):
#   cmake -S . -B build-gpu -DONEPASS_CUDA=ON && cmake --build build-gpu -j2 --target test_attention_cuda bench_attention
#   mkdir -p .device/attn/bin && cp build-gpu/test_attention_cuda build-gpu/bench_attention \
#     /lib/x86_64-linux-gnu/libgomp.so.1 .device/attn/bin/ && cp /work/shared/anchors/anchor_attention.py .device/attn/
# then run `bash scripts/gpu_attention.sh [--anchor] [--profile]` on the device with carry [".device/attn"].
set -u
out=${OUT:-/tmp/attn_out}
mkdir -p "$out"
bin=.device/attn/bin
export LD_LIBRARY_PATH=$PWD/$bin:${LD_LIBRARY_PATH:-}
date -u | tee "$out/info.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$out/info.log"

echo "== test"
$bin/test_attention_cuda 2>&1 | tee "$out/test.log" | tail -40
echo "test rc=${PIPESTATUS[0]}"

echo "== memcheck (quick)"
ATTN_TEST_QUICK=1 timeout 150 compute-sanitizer --error-exitcode 1 --tool memcheck --leak-check full $bin/test_attention_cuda \
  > "$out/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -3 "$out/memcheck.log"
echo "== racecheck (quick)"
ATTN_TEST_QUICK=1 timeout 150 compute-sanitizer --error-exitcode 1 --tool racecheck --racecheck-report all $bin/test_attention_cuda \
  > "$out/racecheck.log" 2>&1; echo "racecheck rc=$?"; tail -3 "$out/racecheck.log"

echo "== bench"
$bin/bench_attention 2>&1 | tee "$out/bench.log"
if [ "${1:-}" = "--anchor" ]; then
  echo "== anchor (FlexAttention)"
  PYTHONUNBUFFERED=1 python3 .device/attn/anchor_attention.py 4096 16384 2>&1 | grep '^{' | tee "$out/anchor.log"
fi
if [ "${1:-}" = "--profile" ] || [ "${2:-}" = "--profile" ]; then
  # Nsight Compute on one launch of each main kernel (S=16384, causal): time, tensor and
  # shared-memory pipe use, occupancy, stall reasons. Launch order in bench_attention:
  # 35 forwards, then (fwd, dkdv) x 35 atomic, then (fwd, dkdv, dq) x 35 deterministic.
  metrics=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum
  for spec in "attn_fwd_kernel 0" "attn_bwd_dkdv_kernel 0" "attn_bwd_dq_kernel 0"; do
    set -- $spec
    timeout 200 ncu --clock-control none -k regex:$1 --launch-skip $2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --metrics $metrics \
      $bin/bench_attention 16384 causal > "$out/ncu_$1.log" 2>&1
    echo "== ncu $1 rc=$?"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|hmma|mem_shared|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" "$out/ncu_$1.log" | head -30
  done
fi
