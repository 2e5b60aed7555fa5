#!/usr/bin/env bash
# One device call for the CUDA KV-cache decoder: tests/test_decode_cuda.cu, the same test
# under compute-sanitizer memcheck, and the decode benchmark (bench/bench_decode.cu).
# Logs to $OUT (decode_*.log). Prepare on the build machine, from the repo root:
#   cmake --build build --target test_decode_cuda bench_decode -j2
#   scripts/device_bundle.sh build .device/decode test_decode_cuda bench_decode
# then run `BIN=.device/decode bash scripts/gpu_decode.sh` on the device with carry
# [".device/decode"]. Extra arguments go to bench_decode (e.g. `tinyllama 64 512 128`).
set -u
out=${OUT:-/tmp/decode_out}
mkdir -p "$out"
bin=${BIN:-.device/decode}
export LD_LIBRARY_PATH=$PWD/$bin:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/decode_info.log"

echo "== test_decode_cuda"
$bin/test_decode_cuda > "$out/decode_test.log" 2>&1; rc=$?
grep -E "^(TEST_SEED|decoder|  kernel|  incremental|  7-token)" "$out/decode_test.log"
grep FAIL "$out/decode_test.log" | head -10
echo "test_decode_cuda rc=$rc $(tail -1 "$out/decode_test.log")"

echo "== memcheck"
timeout 360 compute-sanitizer --error-exitcode 1 --tool memcheck --leak-check full $bin/test_decode_cuda \
  > "$out/decode_memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -3 "$out/decode_memcheck.log"

echo "== bench_decode"
timeout 180 $bin/bench_decode "$@" 2>&1 | tee "$out/decode_bench.log"
