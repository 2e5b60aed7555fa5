#!/usr/bin/env bash
# The CPU demonstration (configs/demo_cpu.json on `train gen-data --profile demo`), cut to
# a smoke run: the generated files; turn 2's answer trained under duplicate and mask_only
# alike (six target tokens: four digits, ".", the end of turn); 20 steps of each layout;
# `train eval` on a final checkpoint scores both turns of every eval conversation and
# prints the per-turn table and the later-turn answer loss.
source "$(dirname "$0")/lib_cli.sh" "$1"
d="$tmp/data"
"$train" gen-data --profile demo --out-dir "$d" --train 200 --eval 20 > "$tmp/gen" 2>&1 && ok || bad "gen-data: $(cat "$tmp/gen")"
check "200 training conversations" "[ \$(wc -l < '$d/train.jsonl') -eq 200 ]"
check "20 eval conversations" "[ \$(wc -l < '$d/eval.jsonl') -eq 20 ]"
cfg=(--config configs/demo_cpu.json --set data.train_path="$d/train.jsonl" --set data.eval_path="$d/eval.jsonl")
for layout in duplicate mask_only; do
    "$train" pack "${cfg[@]}" --set data.layout=$layout --out "$tmp/rows.jsonl" --show 1 > "$tmp/show" 2>&1 || bad "pack $layout"
    # "pos position turn role token text target text": turn index 1 is the second turn.
    n=$(awk '$3 == 1 && $4 == "answer" && $NF != "-"' "$tmp/show" | wc -l)
    n_prompt=$(awk '$3 == 1 && $4 == "prompt" && $NF != "-"' "$tmp/show" | wc -l)
    check "$layout trains turn 2's answer (got $n + $n_prompt targets)" "[ $n -eq 5 ] && [ $n_prompt -eq 1 ]"
    if "$train" "${cfg[@]}" --set data.layout=$layout --set out_dir="$tmp/$layout" --set train.steps=20 \
        --set eval.every=0 > "$tmp/log_$layout" 2>&1; then ok; else bad "train $layout: $(tail -3 "$tmp/log_$layout")"; fi
done
if "$train" eval "${cfg[@]}" --set model.init_from="$tmp/mask_only/checkpoint-000020" \
    --json "$tmp/eval.json" > "$tmp/elog" 2>&1; then ok; else bad "eval: $(tail -3 "$tmp/elog")"; fi
check "eval scores 40 turns of 20 conversations" "grep -Eq '^accuracy [0-9.]+ \\([0-9]+/40 turns of 20 conversations\\)' '$tmp/elog'"
check "per-turn table: turn 1" "grep -Eq '^\\| 1 \\| 20 \\| [0-9]+ \\| [0-9.]+ \\|$' '$tmp/elog'"
check "per-turn table: turn 2" "grep -Eq '^\\| 2 \\| 20 \\| [0-9]+ \\| [0-9.]+ \\|$' '$tmp/elog'"
check "later-turn answer loss" "grep -Eq '\"later_turn_answer_loss\": [0-9]' '$tmp/eval.json'"
finish
