#!/usr/bin/env bash
# For each HF folder under FIXTURES: `train` from model.init_from for one step at lr 0
# (the weights stay the input's) with an eval after it, `train pack` of the same eval
# conversations (npass, the eval's inference view), `train export`, then
# bench/anchors/hf_compare.py: transformers' loss of the exported folder on those rows against
# onepass's eval loss. Needs python3 with torch and transformers; runs from the repository root.
#   scripts/repro/hf_roundtrip.sh TRAIN FIXTURES OUT BACKEND(cpu|cuda)
set -uo pipefail  # a FAIL of hf_compare.py fails the pipeline through grep
train="$1"; fixtures="$2"; out="$3"; backend="$4"
status=0
common=(--set data.seq_len=1024 --set data.eval_path=datasets/synthetic/eval.jsonl
        --set data.tokenizer=datasets/synthetic/tokenizer.model)
for dir in "$fixtures"/*/; do
  f=$(basename "$dir"); d="$out/$f"; mkdir -p "$d"
  if ! "$train" --set model.init_from="$dir" --set backend="$backend" --set out_dir="$d/run" \
      --set train.steps=1 --set train.lr=0 --set train.warmup_steps=0 --set eval.every=1 \
      --set eval.max_conversations=200 --set train.micro_rows=2 \
      --set train.tokens_per_step=2048 --set train.save_dtype=f32 "${common[@]}" > "$d/train.log" 2>&1; then
    echo "FAIL $f: train: $(tail -2 "$d/train.log")"; status=1; continue
  fi
  if ! "$train" pack --set model.init_from="$dir" --set data.layout=npass \
      --set data.train_path=datasets/synthetic/eval.jsonl "${common[@]}" --out "$d/rows.jsonl" \
      > "$d/pack.log" 2>&1; then
    echo "FAIL $f: pack: $(tail -2 "$d/pack.log")"; status=1; continue
  fi
  "$train" export --from "$d/run/checkpoint-000001" --out "$d/export" --dtype f32 > "$d/export.log" 2>&1 \
    || { echo "FAIL $f: export: $(tail -2 "$d/export.log")"; status=1; continue; }
  echo "$f ($backend): $(grep -m1 '^backend' "$d/train.log")"
  python3 bench/anchors/hf_compare.py --export "$d/export" --rows "$d/rows.jsonl" \
    --metrics "$d/run/metrics.jsonl" 2>&1 | grep -E '^(OK|FAIL|info)' || status=1
done
exit $status
