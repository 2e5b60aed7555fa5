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
if out=$("$train" --help 2>&1) && grep -q "train pack" <<<"$out"; then ok; else bad "train --help"; fi
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
