#!/usr/bin/env bash
# Resume checks: a resume with another model shape, rope_theta,
# data.seq_len, data.layout, train.tokens_per_step or another data file (same path,
# other bytes) is refused naming what changed; keys that may change (lr, steps) are
# reported; a checkpoint whose files were mixed from two saves or corrupted is refused.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_data
export OMP_NUM_THREADS=2
head -n 200 "$data/train.jsonl" > "$tmp/train.jsonl"
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=4
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=1
      --set eval.every=0 --set data.seq_len=1024 --set train.steps=2 --set seed=5
      --set data.train_path="$tmp/train.jsonl")
run="$tmp/run"; ck="$run/checkpoint-000002"
"$train" --set out_dir="$run" "${tiny[@]}" > "$tmp/a.log" 2>&1 && ok || bad "first run: $(tail -3 "$tmp/a.log")"
resume() { "$train" --set out_dir="$tmp/r" --set train.overwrite=true "${tiny[@]}" --set train.resume="$ck" --set train.steps=3 "$@"; }

expect_error "4 layers resumed as 2" "model.num_hidden_layers: 4 -> 2" resume --set model.num_hidden_layers=2
expect_error "rope_theta" "model.rope_theta: 10000.0 -> 500000.0" resume --set model.rope_theta=500000
expect_error "seq_len" "data.seq_len: 1024 -> 2048" resume --set data.seq_len=2048
expect_error "layout" "data.layout: \"duplicate\" -> \"mask_only\"" resume --set data.layout=mask_only
expect_error "tokens_per_step" "train.tokens_per_step: 1024 -> 2048" resume --set train.tokens_per_step=2048
expect_error "the refusal says what may not change" "these must not change on resume" resume --set data.seq_len=2048
cp "$tmp/train.jsonl" "$tmp/train.orig"; sed -i '1d' "$tmp/train.jsonl"
expect_error "another data file under the same path" "data.train_path: the file's contents changed" resume
cp "$tmp/train.orig" "$tmp/train.jsonl"
# Keys that may change are reported.
if out=$(resume --set train.lr=0.001 2>&1) && grep -q "^resume: changed since the checkpoint: .*train.lr: 0.003 -> 0.001" <<<"$out" &&
   grep -q "train.steps: 2 -> 3" <<<"$out"; then ok; else bad "lr change reported: $(tail -3 <<<"$out")"; fi
# Mixed and corrupt checkpoints.
"$train" --set out_dir="$tmp/b" "${tiny[@]}" --set train.lr=0.002 > "$tmp/b.log" 2>&1 || bad "run b"
cp -r "$ck" "$tmp/mixed"; cp "$tmp/b/checkpoint-000002/optimizer.safetensors" "$tmp/mixed/"
expect_error "files of two runs" "different saves" resume --set train.resume="$tmp/mixed"
cp -r "$ck" "$tmp/corrupt"
f="$tmp/corrupt/model.safetensors"; printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 7 )) conv=notrunc 2>/dev/null
expect_error "a flipped byte" "model.safetensors: checksum mismatch" resume --set train.resume="$tmp/corrupt"

finish
