#!/usr/bin/env bash
# One device call for the CUDA training backend: op and model correctness tests, the
# trainer benchmark, and (with --anchor) anchor_trainer.py (PyTorch + torch.compile +
# FlexAttention) on the same GPU. Expects binaries + libraries in .device/lead
# (scripts/device_bundle.sh build-lead .device/lead test_ops_cuda test_model_cuda
# bench_trainer train) and anchor_trainer.py there too. Logs to $OUT.
set -u
out=${OUT:-/tmp/model_out}; mkdir -p "$out"
bin=.device/lead
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/info.log"
echo "== test_ops_cuda"; $bin/test_ops_cuda > "$out/ops.log" 2>&1; echo "rc=$?"; grep -E "FAIL|passed" "$out/ops.log" | tail -15
echo "== test_model_cuda"; $bin/test_model_cuda > "$out/model.log" 2>&1; echo "rc=$?"; grep -E "FAIL|passed|loss" "$out/model.log" | tail -25
echo "== bench_trainer"
for c in small tinyllama; do timeout 200 $bin/bench_trainer --config configs/bench_$c.json 2>&1 | tail -3 | tee -a "$out/bench.log"; done
if [ "${1:-}" = "--anchor" ]; then
  echo "== anchor_trainer"
  for a in "small 8192" "tinyllama 4096"; do PYTHONUNBUFFERED=1 timeout 240 python3 $bin/anchor_trainer.py $a 1 2>&1 | grep '^{' | tee -a "$out/anchor.log"; done
fi
