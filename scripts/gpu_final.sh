#!/usr/bin/env bash
# One device call that checks and times the whole CUDA path: every CUDA test binary in
# BIN (test_*_cuda), the GPU CLI checks (tests/cli_*_cuda.sh), then, unless --tests-only,
# the (a)/(b) loss-curve runs on the GPU (plotted afterwards here with
# scripts/loss_curves.sh --plot-only) and the trainer benchmark, beside anchor_trainer.py
# (PyTorch + torch.compile + FlexAttention) with --anchor.
# Expects `scripts/device_bundle.sh build .device/lead <the test_*_cuda binaries> bench_trainer
# train` and anchor_trainer.py in .device/lead.
#   BIN=.device/lead bash scripts/gpu_final.sh [--tests-only | --anchor]
# Every test has 300 s (rc 124 when it runs past them), so a hang costs one test, not the call.
set -u
out=/tmp/final_out; mkdir -p "$out"  # packed into $OUT/final.tar.gz at the end (few files come back)
bin=${BIN:-.device/lead}
# RUNPATH $ORIGIN covers a binary's own libraries, not theirs (cairo's pixman): the bundle is on the path.
export LD_LIBRARY_PATH=$PWD/$bin:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/info.log"
# libnccl is opened at run time (trainer/nccl_cuda.cu); the GPU machine has PyTorch's copy.
if [ -z "${ONEPASS_NCCL_LIBRARY:-}" ]; then
  ONEPASS_NCCL_LIBRARY=$(find /opt /usr -name 'libnccl.so.2' 2>/dev/null | head -1); export ONEPASS_NCCL_LIBRARY
fi
for path in "$bin"/test_*_cuda; do
  t=$(basename "$path"); timeout 300 "$path" > "$out/$t.log" 2>&1; echo "$t rc=$? $(tail -1 "$out/$t.log")"
  grep -E "FAIL|SKIP" "$out/$t.log" | head -5
done
for script in tests/cli_*_cuda.sh; do
  t=$(basename "$script" .sh); timeout 300 bash "$script" $bin/train > "$out/$t.log" 2>&1
  echo "$t rc=$? $(tail -1 "$out/$t.log")"; grep -E "FAIL|SKIP" "$out/$t.log" | head -5
done
if [ "${1:-}" = "--tests-only" ]; then tar -C /tmp -czf "${OUT:-/tmp}/final.tar.gz" final_out; exit 0; fi
for layout in npass duplicate mask_only; do
  d="$out/curves_$layout"; s=$(date +%s.%N)
  $bin/train --config configs/strip_thinking.json --set data.layout=$layout --set out_dir="$d" \
    --set train.checkpoint_every=0 > "$out/curves_$layout.log" 2>&1 || echo "curve $layout failed"
  awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f\n", b - a}' > "$d/wall_s"
  rm -rf "$d"/checkpoint-*; echo "$layout: $(tail -1 "$out/curves_$layout.log") wall $(cat "$d/wall_s") s"
done
grep -m1 "backend" "$out/curves_duplicate.log"
for c in small tinyllama; do timeout 120 $bin/bench_trainer --config configs/bench_$c.json 2>&1 | tail -1 | tee -a "$out/bench.log"; done
if [ "${1:-}" = "--anchor" ]; then
  for a in "small 8192" "tinyllama 4096"; do PYTHONUNBUFFERED=1 timeout 150 python3 $bin/anchor_trainer.py $a 1 2>&1 | grep '^{' | tee -a "$out/anchor.log"; done
fi
tar -C /tmp -czf "${OUT:-/tmp}/final.tar.gz" final_out
