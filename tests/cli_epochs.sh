#!/usr/bin/env bash
# train.epochs: the run's steps are those that take that many passes over the training
# conversations (the last step is the first whose epoch reaches it: metrics' "epoch" is
# epoch + position / conversations, after the step), and the step line shows the epoch.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
head -n 30 "$data/train.jsonl" > "$tmp/train.jsonl"
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=1
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=1
      --set data.seq_len=1024 --set eval.every=0 --set backend=cpu --set data.train_path="$tmp/train.jsonl")
if "$train" "${tiny[@]}" --set train.epochs=1.5 --set out_dir="$tmp/run" > "$tmp/log" 2>&1; then ok; else bad "run: $(tail -3 "$tmp/log")"; fi
steps=$(wc -l < "$tmp/run/metrics.jsonl")
epoch() { sed -n "${1}p" "$tmp/run/metrics.jsonl" | grep -o '"epoch":[^,}]*' | cut -d: -f2; }
# 30 conversations: the last step ends at or past 45 taken, the one before it short of 45.
if awk -v a="$(epoch $((steps - 1)))" -v b="$(epoch "$steps")" 'BEGIN{exit !(a < 1.5 && b >= 1.5 && b < 2)}'; then ok
else bad "epochs at the last two of $steps steps: $(epoch $((steps - 1))) $(epoch "$steps")"; fi
if grep -q "^train.epochs 1.5: $steps steps of 1024 trained tokens over 30 conversations" "$tmp/log"; then ok; else bad "epochs line: $(grep epochs "$tmp/log")"; fi
if grep -Eq "^step $steps/$steps \| .* \| epoch $(epoch "$steps" | cut -c1-3)[0-9]*\$" "$tmp/log"; then ok; else bad "step line: $(grep "^step $steps/" "$tmp/log")"; fi
# The same from the steps' own conversation counts: 45 taken by the last step, not before.
if awk -F'"conversations":' '{split($2,a,","); total+=a[1]; last=a[1]} END{exit !(total >= 45 && total - last < 45)}' \
    "$tmp/run/metrics.jsonl"; then ok; else bad "conversations taken"; fi
finish
