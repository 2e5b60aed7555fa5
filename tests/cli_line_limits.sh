#!/usr/bin/env bash
# Every JSONL reader takes the data.* reading options of the run: the eval accuracy set,
# `train generate --prompts` and `train tokenizer --corpus-from` refuse a line over
# data.max_line_bytes before parsing it (or skip it under data.skip_too_long), skip bad
# lines under data.skip_bad and count unknown keys under data.ignore_unknown_keys, as
# the training and eval-loss readers do.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_data
export OMP_NUM_THREADS=2
small=(--set backend=cpu --set model.init_from=tests/data/hf/qwen3_qknorm_sharded
       --set data.tokenizer=datasets/synthetic/tokenizer.model
       --set train.tokens_per_step=1024 --set train.micro_rows=1 --set train.warmup_steps=1
       --set data.seq_len=1024 --set train.steps=1 --set eval.every=1
       --set eval.generate_conversations=10 --set generate.max_new_tokens=2)
# A valid line padded with JSON whitespace to over 3000 bytes, then two short ones.
pad=$(head -c 4000 /dev/zero | tr '\0' ' ')
{ head -1 "$data/eval.jsonl" | sed "s/^{/{$pad/"; sed -n 2,3p "$data/eval.jsonl"; } > "$tmp/long.jsonl"
{ echo '{"messages": 1}'; sed -n 2,3p "$data/eval.jsonl"; } > "$tmp/bad.jsonl"
{ head -1 "$data/eval.jsonl" | sed 's/^{/{"idx": 5, /'; sed -n 2,3p "$data/eval.jsonl"; } > "$tmp/keys.jsonl"

accuracy() {  # accuracy <eval file> <expected conversations> <description> <settings...>
    local file="$1" want="$2" what="$3"; shift 3
    rm -rf "$tmp/out"
    if out=$("$train" --set out_dir="$tmp/out" --set data.eval_path="$file" "${small[@]}" "$@" 2>&1); then
        grep -q "eval accuracy: [0-9]* turns of $want conversations" <<<"$out" && ok \
            || bad "$what: $(grep 'eval accuracy' <<<"$out")"
    else
        bad "$what: $(tail -2 <<<"$out")"
    fi
}
accuracy "$tmp/long.jsonl" 2 "a line over data.max_line_bytes skipped by the accuracy set too" \
    --set data.max_line_bytes=3000 --set data.skip_too_long=true
accuracy "$tmp/bad.jsonl" 2 "a bad line skipped by the accuracy set under data.skip_bad" \
    --set data.skip_bad=true
accuracy "$tmp/keys.jsonl" 3 "an unknown key counted by the accuracy set under data.ignore_unknown_keys" \
    --set data.ignore_unknown_keys=true

# generate --prompts: a padded prompt line, then a short one.
{ head -1 "$data/eval.jsonl" | sed "s/^{/{$pad/"; echo '{"messages":[{"role":"user","content":"Add 7 and 8."}]}'; } > "$tmp/prompts.jsonl"
gen=("$train" generate "${small[@]}" --prompts "$tmp/prompts.jsonl" --out "$tmp/gen.jsonl")
long_bytes=$(( $(head -n 1 "$tmp/prompts.jsonl" | wc -c) - 1 ))
expect_error "generate: a prompt line over data.max_line_bytes" \
    "prompts.jsonl:1: the line is $long_bytes bytes, over data.max_line_bytes 3000" \
    "${gen[@]}" --set data.max_line_bytes=3000

# tokenizer --corpus-from takes --config / --set as the other commands do.
{ head -1 "$data/train.jsonl" | sed "s/^{/{$pad/"; head -200 "$data/train.jsonl"; } > "$tmp/corpus.jsonl"
long_bytes=$(( $(head -n 1 "$tmp/corpus.jsonl" | wc -c) - 1 ))
expect_error "tokenizer: a corpus line over data.max_line_bytes" \
    "corpus.jsonl:1: the line is $long_bytes bytes, over data.max_line_bytes 3000" \
    "$train" tokenizer --corpus-from "$tmp/corpus.jsonl" --out "$tmp/tok" --vocab-size 512 \
    --set data.max_line_bytes=3000
if out=$("$train" tokenizer --corpus-from "$tmp/corpus.jsonl" --out "$tmp/tok" --vocab-size 512 \
        --set data.max_line_bytes=3000 --set data.skip_too_long=true 2>&1) &&
   grep -q "tokenizer: 200 samples" <<<"$out"; then ok; else bad "tokenizer skip_too_long: $(tail -2 <<<"$out")"; fi
finish
