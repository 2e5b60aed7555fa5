#!/usr/bin/env bash
# One device call that checks and times the whole CUDA path: every CUDA test, the GPU
# training checks (tests/cli_train_cuda.sh), the (a)/(b) loss-curve runs on the GPU
# (plotted afterwards here with scripts/loss_curves.sh --plot-only), and the trainer
# benchmark beside anchor_trainer.py (PyTorch + torch.compile + FlexAttention).
# Expects `scripts/device_bundle.sh build-lead .device/lead test_ops_cuda test_model_cuda
# test_attention_cuda test_train_cuda bench_trainer train` and anchor_trainer.py in .device/lead.
set -u
out=/tmp/final_out; mkdir -p "$out"  # packed into $OUT/final.tar.gz at the end (few files come back)
bin=${BIN:-.device/lead}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/info.log"
for t in test_ops_cuda test_model_cuda test_attention_cuda test_train_cuda; do
  $bin/$t > "$out/$t.log" 2>&1; echo "$t rc=$? $(tail -1 "$out/$t.log")"; grep FAIL "$out/$t.log" | head -5
done
bash tests/cli_train_cuda.sh $bin/train > "$out/cli_train_cuda.log" 2>&1; echo "cli_train_cuda rc=$? $(tail -1 "$out/cli_train_cuda.log")"
grep FAIL "$out/cli_train_cuda.log" | head -5
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
