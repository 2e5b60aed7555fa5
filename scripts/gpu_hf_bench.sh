#!/usr/bin/env bash
# Fine-tuning speed and memory at real Hugging Face shapes (issue 10), in one device call:
# bench_trainer (the trainer's CUDA backend, random weights, configs/bench_qwen3_0.6b.json
# and configs/bench_qwen2.5_1.5b.json: model.init_from a real config.json) and the PyTorch
# anchor (../shared/anchors/anchor_trainer.py with scripts/anchor_trainer_hf.patch: head_dim,
# q/k norm, q/k/v biases, tied head, theta, eps) on the same shapes, one strip-thinking row
# of S tokens per step; then a table of step time, tokens/s, MFU and peak GPU memory.
# Here, from the repository root:
#   bash scripts/gpu_hf_bench.sh --prepare    # the patched anchor into .device/anchors/
#   cmake --build build --target bench_trainer -j2
#   scripts/device_bundle.sh build .device/hfbench bench_trainer
# Device call: command "BIN=.device/hfbench bash scripts/gpu_hf_bench.sh",
#   carry [".device/hfbench", ".device/anchors"]. S=8192 for longer rows (default 4096);
#   ANCHOR=0 skips the anchor; SHAPES=qwen3-0.6b (or qwen2.5-1.5b) runs one shape, should
#   both with their torch.compile warm-ups not fit one call's 10 minutes.
#   Logs under $OUT/hf_bench/.
set -u
anchors=.device/anchors
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$anchors"
  install -m 644 ../shared/anchors/anchor_trainer.py "$anchors/anchor_trainer.py"
  patch -s "$anchors/anchor_trainer.py" scripts/anchor_trainer_hf.patch && echo "patched $anchors/anchor_trainer.py"
  exit
fi
bin=${BIN:-.device/hfbench}; S=${S:-4096}
out=${OUT:-/tmp}/hf_bench; mkdir -p "$out"; rm -f "$out/results.jsonl"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/info.log"
for shape in ${SHAPES:-qwen3-0.6b qwen2.5-1.5b}; do
  set -- "$shape" "bench_$(tr - _ <<<"$shape")"
  timeout 240 "$bin/bench_trainer" --config "configs/$2.json" --set data.seq_len="$S" \
    > "$out/onepass_$1.log" 2>&1 || echo "onepass $1 failed: $(tail -2 "$out/onepass_$1.log")"
  grep '^{' "$out/onepass_$1.log" | tail -1 | sed "s/^{/{\"impl\": \"onepass\", \"shape\": \"$1\", /" >> "$out/results.jsonl"
  if [ "${ANCHOR:-1}" = 1 ]; then
    PYTHONUNBUFFERED=1 timeout 300 python3 "$anchors/anchor_trainer.py" "$1" "$S" 1 \
      > "$out/anchor_$1.log" 2>&1 || echo "anchor $1 failed: $(tail -2 "$out/anchor_$1.log")"
    grep '^{' "$out/anchor_$1.log" | tail -1 | sed "s/^{/{\"impl\": \"anchor\", \"shape\": \"$1\", /" >> "$out/results.jsonl"
  fi
done
python3 - "$out/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'shape':14} {'impl':8} {'params_M':>8} {'S':>6} {'step_ms':>8} {'tokens/s':>9} {'MFU':>6} {'peak GiB':>8}")
for r in rows:
    print(f"{r['shape']:14} {r['impl']:8} {r['params_M']:8.1f} {r['S']:6d} {r['step_ms']:8.2f} "
          f"{r['tokens_per_s']:9.0f} {r['mfu_vs_790']:6.3f} {r['mem_GiB']:8.2f}")
PY
