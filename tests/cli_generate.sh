#!/usr/bin/env bash
# `train generate` and `train eval` on a tiny model trained here for a few steps: the
# output's structure (one line per prompt, the prompt in its inference view: headers
# from the template, earlier thinking stripped), determinism (same seed = same output,
# greedy = temperature 0 = top_p down to one token), the length limit, the accuracy
# report's fields and turn counts, accuracy in metrics.jsonl during training, and the
# errors (last message not a user message, a missing file, no model).
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=2
      --set eval.max_conversations=2 --set data.seq_len=1024)

# Two conversations for eval: 2 + 1 assistant turns (the first with history thinking).
head -2 "$data/eval.jsonl" > "$tmp/eval2.jsonl"
want_turns=$(grep -o '"role":"assistant"\|"from":"gpt"' "$tmp/eval2.jsonl" | wc -l)
if "$train" --set out_dir="$tmp/run" --set train.steps=4 --set eval.every=2 \
    --set data.eval_path="$tmp/eval2.jsonl" --set eval.generate_conversations=1 \
    --set generate.max_new_tokens=8 "${tiny[@]}" > "$tmp/log" 2>&1; then ok; else bad "training: $(tail -3 "$tmp/log")"; fi
check "eval_accuracy on eval steps" "[ \$(grep -c '\"eval_accuracy\":' '$tmp/run/metrics.jsonl') -eq 2 ] && [ \$(grep -c '\"eval_later_turn_accuracy\":' '$tmp/run/metrics.jsonl') -eq 2 ]"
check "eval_accuracy on the console" "grep -q 'eval_accuracy [0-9.]* | eval_later_turn_accuracy' '$tmp/log'"
model=(--set model.init_from="$tmp/run/checkpoint-000004")

cat > "$tmp/prompts.jsonl" <<'JSONL'
{"messages":[{"role":"user","content":"Add 12 and 30."},{"role":"assistant","content":"The result is 42.","reasoning_content":"12 + 30 = 42."},{"role":"user","content":"Now add 1 to the result."}]}
{"conversations":[{"from":"system","value":"Be exact."},{"from":"human","value":"Add 5 and 6."}]}
{"messages":[{"role":"user","content":"Add 7 and 8."}]}
JSONL
gen() { "$train" generate "${model[@]}" --prompts "$tmp/prompts.jsonl" "$@"; }
if gen --out "$tmp/g0.jsonl" --set generate.max_new_tokens=12 > "$tmp/glog" 2>&1; then ok; else bad "generate: $(tail -3 "$tmp/glog")"; fi
check "one line per prompt" "[ \$(wc -l < '$tmp/g0.jsonl') -eq 3 ]"
for key in text tokens prompt_tokens stop; do
    check "every line has $key" "[ \$(grep -c '\"$key\":' '$tmp/g0.jsonl') -eq 3 ]"
done
# Template ids (data/template.c order after <unk>): 1 system, 2 user, 3 assistant, 4 <think>.
prompt_of() { sed -n "${1}p" "$tmp/g0.jsonl" | grep -o '"prompt_tokens":\[[0-9,]*\]' | cut -d'[' -f2 | tr -d ']'; }
check "prompt 3: user header first, assistant header last" "[[ '$(prompt_of 3)' == 2,*,3 ]]"
check "prompt 2: system header first" "[[ '$(prompt_of 2)' == 1,* ]]"
check "prompt 1: two assistant headers, history thinking stripped" \
    "[ \$(tr , '\n' <<<'$(prompt_of 1)' | grep -cx 3) -eq 2 ] && ! tr , '\n' <<<'$(prompt_of 1)' | grep -qx 4"
n_tokens() { sed -n "${1}p" "$2" | grep -o '"tokens":\[[0-9,]*\]' | tr -cd , | wc -c; }
check "at most max_new_tokens (12) each" "[ \$(n_tokens 1 '$tmp/g0.jsonl') -le 11 ] && [ \$(n_tokens 3 '$tmp/g0.jsonl') -le 11 ]"
check "stop is end_of_turn or length" "[ \$(grep -Ec '\"stop\":\"(end_of_turn|length)\"' '$tmp/g0.jsonl') -eq 3 ]"
check "tokens/s reported" "grep -q 'tokens/s' '$tmp/glog'"

sampled() { gen --out "$tmp/$1" --set generate.max_new_tokens=12 --set generate.temperature=1.5 "${@:2}" >> "$tmp/glog" 2>&1; }
sampled s1.jsonl --set generate.seed=5; sampled s2.jsonl --set generate.seed=5
sampled s3.jsonl --set generate.seed=6
check "same seed, same output" "cmp -s '$tmp/s1.jsonl' '$tmp/s2.jsonl'"
check "another seed, another output" "! cmp -s '$tmp/s1.jsonl' '$tmp/s3.jsonl'"
gen --out "$tmp/g1.jsonl" --set generate.max_new_tokens=12 --set generate.temperature=0 >> "$tmp/glog" 2>&1
gen --out "$tmp/g2.jsonl" --set generate.max_new_tokens=12 --set generate.temperature=1 \
    --set generate.top_p=1e-9 --set generate.seed=9 >> "$tmp/glog" 2>&1
check "greedy is temperature 0" "cmp -s '$tmp/g0.jsonl' '$tmp/g1.jsonl'"
check "top_p down to one token is greedy" "cmp -s '$tmp/g0.jsonl' '$tmp/g2.jsonl'"

# Errors.
head -1 "$data/eval.jsonl" > "$tmp/ends_assistant.jsonl"
expect_error "last message not a user message" "ends_assistant.jsonl:1: .*the last message must be '\\(user\\|human\\)'" \
    "$train" generate "${model[@]}" --prompts "$tmp/ends_assistant.jsonl" --out "$tmp/x.jsonl"
expect_error "missing prompts file" "$tmp/missing.jsonl" \
    "$train" generate "${model[@]}" --prompts "$tmp/missing.jsonl" --out "$tmp/x.jsonl"
expect_error "no model" "model.init_from" \
    "$train" generate --prompts "$tmp/prompts.jsonl" --out "$tmp/x.jsonl"
expect_error "no --out" "--prompts and --out are required" \
    "$train" generate "${model[@]}" --prompts "$tmp/prompts.jsonl"
check "no output left by the errors" "[ ! -e '$tmp/x.jsonl' ]"

# train eval: every turn of every conversation, the report's fields.
if "$train" eval "${model[@]}" --set data.eval_path="$tmp/eval2.jsonl" --set generate.max_new_tokens=8 \
    --json "$tmp/eval.json" > "$tmp/elog" 2>&1; then ok; else bad "eval: $(tail -3 "$tmp/elog")"; fi
for key in accuracy first_turn_accuracy later_turn_accuracy per_turn eval_loss eval_answer_loss later_turn_answer_loss generated_tokens; do
    check "eval json has $key" "grep -q '\"$key\":' '$tmp/eval.json'"
done
check "eval scores every assistant turn ($want_turns)" "grep -q '\"turns\": $want_turns,' '$tmp/eval.json'"
check "eval console line" "grep -Eq '^accuracy [0-9.]+ \\([0-9]+/$want_turns turns of 2 conversations\\) \\| first turn' '$tmp/elog'"
# One-turn conversations have no later turn: its answer loss is null, and the answer loss
# is the first turn's alone.
printf '%s\n' '{"messages":[{"role":"user","content":"Add 2 and 3."},{"role":"assistant","content":"The result is 5.","reasoning_content":"2 + 3 = 5."}]}' \
    '{"messages":[{"role":"user","content":"Add 4 and 4."},{"role":"assistant","content":"The result is 8.","reasoning_content":"4 + 4 = 8."}]}' > "$tmp/one_turn.jsonl"
if "$train" eval "${model[@]}" --set data.eval_path="$tmp/one_turn.jsonl" --set generate.max_new_tokens=4 \
    --json "$tmp/one.json" > /dev/null 2>&1 && grep -q '"later_turn_answer_loss": null' "$tmp/one.json"; then ok
else bad "later-turn loss of one-turn conversations: $(grep later_turn_answer "$tmp/one.json")"; fi
check "two-turn eval has a later-turn answer loss" "grep -Eq '\"later_turn_answer_loss\": [0-9]' '$tmp/eval.json'"
expect_error "eval without a model" "model.init_from" "$train" eval --set data.eval_path="$tmp/eval2.jsonl"
finish
