#!/usr/bin/env bash
# Run hygiene: a resume with train.resume=latest and no other key (the checkpoint's own
# config) continues bit for bit; a resume from an earlier checkpoint moves the abandoned
# run's later checkpoints to out_dir/abandoned/; train.save_total_limit keeps the newest
# checkpoints; out_dir/train.log holds the console; a bare `train` prints the help.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
. "$(dirname "$0")/lib_metrics.sh"
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=1
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=1 --set data.seq_len=1024
      --set eval.every=2 --set eval.max_conversations=4 --set backend=cpu --set train.checkpoint_every=2
      --set train.lr=0.01 --set seed=7 --set train.steps=6)
"$train" "${tiny[@]}" --set out_dir="$tmp/straight" > "$tmp/straight.log" 2>&1 || bad "straight run: $(tail -2 "$tmp/straight.log")"
if cmp -s "$tmp/straight.log" "$tmp/straight/train.log"; then ok; else bad "train.log differs from the console"; fi

# Stopped after step 2 (the later checkpoints removed), then resumed with nothing but latest.
cp -r "$tmp/straight" "$tmp/resumed"; rm -rf "$tmp/resumed"/checkpoint-00000[46]
if "$train" --set train.resume=latest --set out_dir="$tmp/resumed" > "$tmp/resumed.log" 2>&1; then ok
else bad "resume latest: $(tail -3 "$tmp/resumed.log")"; fi
grep -q "^train.resume latest: $tmp/resumed/checkpoint-000002" "$tmp/resumed.log" && ok || bad "latest line: $(head -3 "$tmp/resumed.log")"
if cmp -s <(tensor_bytes "$tmp/straight/checkpoint-000006/model.safetensors") <(tensor_bytes "$tmp/resumed/checkpoint-000006/model.safetensors") &&
   cmp -s <(tensor_bytes "$tmp/straight/checkpoint-000006/optimizer.safetensors") <(tensor_bytes "$tmp/resumed/checkpoint-000006/optimizer.safetensors") &&
   diff <(untimed "$tmp/straight/metrics.jsonl") <(untimed "$tmp/resumed/metrics.jsonl") >&2; then ok
else bad "resume latest is not bit for bit"; fi
# train.log: the first run's console, then the resume's appended.
if [ "$(grep -c '^done: 6 steps' "$tmp/resumed/train.log")" -eq 2 ] && grep -q "^resumed from" "$tmp/resumed/train.log"; then ok
else bad "train.log after the resume: $(grep -c . "$tmp/resumed/train.log") lines"; fi
# latest with --config too (the run's own run_config.json).
cp -r "$tmp/straight" "$tmp/withconfig"; rm -rf "$tmp/withconfig"/checkpoint-00000[46]
if "$train" --config "$tmp/withconfig/run_config.json" --set out_dir="$tmp/withconfig" --set train.resume=latest \
    > "$tmp/withconfig.log" 2>&1 &&
   cmp -s <(tensor_bytes "$tmp/straight/checkpoint-000006/model.safetensors") <(tensor_bytes "$tmp/withconfig/checkpoint-000006/model.safetensors")
then ok; else bad "latest with --config: $(tail -3 "$tmp/withconfig.log")"; fi
# An override over the checkpoint's config: a changed may-change key is said, a fixed one refused.
cp -r "$tmp/straight" "$tmp/over"; rm -rf "$tmp/over"/checkpoint-00000[46]
out=$("$train" --set train.resume="$tmp/over/checkpoint-000002" --set train.steps=4 2>&1) && ok || bad "resume with train.steps: $(tail -2 <<<"$out")"
grep -q "changed since the checkpoint: train.steps: 6 -> 4" <<<"$out" && [ -d "$tmp/over/checkpoint-000004" ] && ok || bad "override: $(grep -i changed <<<"$out")"
expect_error "fixed key" "must not change on resume" "$train" --set train.resume="$tmp/over/checkpoint-000004" --set data.layout=npass

# Resuming from step 2 of a run that went to 6: checkpoints 4 and 6 move aside.
cp -r "$tmp/straight" "$tmp/again"
out=$("$train" --set train.resume="$tmp/again/checkpoint-000002" --set train.steps=3 --set train.checkpoint_every=0 2>&1) || bad "resume from 2: $(tail -2 <<<"$out")"
if [ -d "$tmp/again/abandoned/checkpoint-000004" ] && [ -d "$tmp/again/abandoned/checkpoint-000006" ] &&
   [ ! -e "$tmp/again/checkpoint-000006" ] && [ -d "$tmp/again/checkpoint-000003" ] &&
   grep -q "checkpoint-000006 is later than the resumed step 2: moved to $tmp/again/abandoned/checkpoint-000006" <<<"$out"
then ok; else bad "later checkpoints: $(ls "$tmp/again") / $out"; fi
[ "$(wc -l < "$tmp/again/metrics.jsonl")" -eq 3 ] && ok || bad "metrics after the resume: $(wc -l < "$tmp/again/metrics.jsonl") lines"

# train.save_total_limit: the newest two.
"$train" "${tiny[@]}" --set train.save_total_limit=2 --set out_dir="$tmp/rotated" > "$tmp/rotated.log" 2>&1
if [ "$(ls -d "$tmp/rotated"/checkpoint-* | xargs -n1 basename | tr '\n' ' ')" = "checkpoint-000004 checkpoint-000006 " ] &&
   grep -q "train.save_total_limit 2: removed $tmp/rotated/checkpoint-000002" "$tmp/rotated.log"; then ok
else bad "rotation: $(ls "$tmp/rotated")"; fi
cmp -s <(tensor_bytes "$tmp/straight/checkpoint-000006/model.safetensors") <(tensor_bytes "$tmp/rotated/checkpoint-000006/model.safetensors") && ok || bad "rotation changed the run"

# A bare `train`: the help, nothing written.
mkdir -p "$tmp/cwd"
if out=$(cd "$tmp/cwd" && "$train" 2>&1) && grep -q "^usage: train" <<<"$out" && grep -q "docs/CONFIG.md" <<<"$out" &&
   [ -z "$(ls -A "$tmp/cwd")" ]; then ok; else bad "bare train: $out"; fi
finish
