#!/usr/bin/env bash
# Messages a user can act on: `train SUB --help` prints that command's
# usage and exits 0; model-shape errors name the model.* keys, never a source file:line.
source "$(dirname "$0")/lib_cli.sh" "$1"
for sub in run pack parity gen-data tokenizer; do
    for flag in --help -h; do
        if out=$("$train" "$sub" "$flag" 2>&1) && grep -q "^usage: train \(\[run\]\|$sub\)" <<<"$out" &&
           grep -q "train $sub\|train \[run\]" <<<"$out"; then ok; else bad "train $sub $flag: rc $? $out"; fi
    done
done
if out=$("$train" pack --config x.json --help 2>&1) && grep -q "usage: train pack" <<<"$out"; then ok; else bad "help after other arguments: $out"; fi
if out=$("$train" --help 2>&1) && grep -q "train pack" <<<"$out" && grep -q "train config" <<<"$out" &&
   grep -q "docs/CONFIG.md" <<<"$out"; then ok; else bad "train --help"; fi
# Each command's --help describes its options.
for pair in "run|--gpus N" "pack|--skip-bad" "export|--dtype D" "generate|--prompts F.jsonl" \
            "gen-data|--out-dir DIR" "tokenizer|--vocab-size N" "show|--conversation N" "eval|--json out.json" \
            "parity|--json out.json" "config|--markdown" "plot|--out FILE.png"; do
    sub=${pair%%|*} option=${pair#*|}
    if out=$("$train" "$sub" --help 2>&1) && [ "$(grep -c -- "^  $option" <<<"$out")" -eq 1 ]; then ok
    else bad "train $sub --help does not describe $option: $out"; fi
done
# A mistyped data field names the field it resembles.
printf '%s\n' '{"mesages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}' > "$tmp/m.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "reasoning_contnet": "x"}]}' > "$tmp/r.jsonl"
out=$("$train" pack --set data.train_path="$tmp/m.jsonl" --out "$tmp/x.jsonl" 2>&1)
grep -q "m.jsonl:1: missing field: .* (is 'mesages' meant to be 'messages'?)" <<<"$out" && ok || bad "mesages: $out"
out=$("$train" pack --set data.train_path="$tmp/r.jsonl" --out "$tmp/x.jsonl" 2>&1)
grep -q "r.jsonl:1: messages\[1\].reasoning_contnet: unknown key (did you mean 'reasoning_content'?)" <<<"$out" && ok || bad "reasoning_contnet: $out"
while IFS='|' read -r sets pattern; do
    # shellcheck disable=SC2086
    out=$("$train" --set out_dir="$tmp/run" $sets 2>&1)
    if [ $? -ne 0 ] && grep -q -- "$pattern" <<<"$out" && ! grep -Eq '[a-z_]+\.(c|cc|cu|h):[0-9]+' <<<"$out"; then ok
    else bad "model shape ($sets): $(tail -1 <<<"$out")"; fi
done <<'EOF2'
--set model.hidden_size=30 --set model.num_attention_heads=4|model.hidden_size 30 is not a multiple of model.num_attention_heads 4
--set model.num_key_value_heads=3|model.num_attention_heads 2 is not a multiple of model.num_key_value_heads 3
--set model.hidden_size=6 --set model.num_attention_heads=2|must be even for RoPE
--set model.vocab_size=100|config key 'model.vocab_size': 100 is smaller than the tokenizer
EOF2
[ ! -e "$tmp/run" ] && ok || bad "a refused model created out_dir"
finish
