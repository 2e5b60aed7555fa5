#!/usr/bin/env bash
# `train plot RUN_DIR`: a PNG of the run's curves beside metrics.jsonl, three panels (loss,
# lr, tokens/s) and a fourth when the run scored accuracy; other metrics give another
# picture; a folder without metrics.jsonl and a bad line are refused by name.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
head -2 "$data/eval.jsonl" > "$tmp/eval.jsonl"
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=1
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=1 --set data.seq_len=1024
      --set backend=cpu --set train.steps=6 --set eval.every=3 --set data.eval_path="$tmp/eval.jsonl")
"$train" "${tiny[@]}" --set out_dir="$tmp/a" > /dev/null 2>&1 || bad "run a"
"$train" "${tiny[@]}" --set out_dir="$tmp/b" --set eval.generate_conversations=1 --set generate.max_new_tokens=4 \
    --set train.lr=0.01 > /dev/null 2>&1 || bad "run b"
# width and height from the PNG's IHDR chunk (bytes 17-24, big-endian)
png_size() { od -An -tu1 -j16 -N8 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4 "x" $5*16777216+$6*65536+$7*256+$8}'; }
if out=$("$train" plot "$tmp/a" 2>&1) && [ "$(head -c 8 "$tmp/a/curves.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] &&
   [ "$(png_size "$tmp/a/curves.png")" = 960x690 ] && grep -q "6 steps, 2 evals -> $tmp/a/curves.png" <<<"$out"; then ok
else bad "plot a: $out $(png_size "$tmp/a/curves.png" 2>&1)"; fi
if "$train" plot "$tmp/b" --out "$tmp/b.png" > /dev/null 2>&1 && [ "$(png_size "$tmp/b.png")" = 960x920 ]; then ok
else bad "plot b with accuracy: $(png_size "$tmp/b.png" 2>&1)"; fi
"$train" plot "$tmp/a" --out "$tmp/a2.png" > /dev/null 2>&1
"$train" "${tiny[@]}" --set out_dir="$tmp/c" --set train.lr=0.01 > /dev/null 2>&1 && "$train" plot "$tmp/c" > /dev/null 2>&1
if cmp -s "$tmp/a/curves.png" "$tmp/a2.png" && [ "$(png_size "$tmp/c/curves.png")" = 960x690 ] &&
   ! cmp -s "$tmp/a/curves.png" "$tmp/c/curves.png"; then ok
else bad "the same metrics give the same picture, others another"; fi
expect_error "no metrics" "train plot: $tmp/none/metrics.jsonl: cannot open" "$train" plot "$tmp/none"
mkdir -p "$tmp/bad"; { head -2 "$tmp/a/metrics.jsonl"; echo '{"loss": 1}'; } > "$tmp/bad/metrics.jsonl"
expect_error "bad line" "$tmp/bad/metrics.jsonl:3: not a metrics line" "$train" plot "$tmp/bad"
finish
