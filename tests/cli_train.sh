#!/usr/bin/env bash
# `train run` end to end on a tiny model: resolved config printed and saved, the backend
# line, metrics.jsonl fields (eval on eval steps), a lower loss, complete checkpoints;
# backend errors; a NaN run stops with the step and saves no checkpoint of the bad state.
train="$1"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
check() { if eval "$2"; then ok; else bad "$1"; fi; }  # check <what> <shell condition>
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=2
      --set eval.max_conversations=4 --set data.seq_len=1024)
export OMP_NUM_THREADS=2

out="$tmp/run"
if "$train" --set out_dir="$out" --set train.steps=4 --set eval.every=2 "${tiny[@]}" \
    > "$tmp/log" 2>&1; then ok; else bad "tiny run exits 0: $(tail -3 "$tmp/log")"; fi
check "backend line" "grep -q '^backend: cpu (' '$tmp/log'"
check "one config line" "grep -q '^config: $out/run_config.json | tokenizer datasets/synthetic/tokenizer.model | chat template onepass | eval datasets/synthetic/eval.jsonl\$' '$tmp/log'"
check "no config dump" "! grep -q '\"tokens_per_step\"' '$tmp/log'"
check "run_config.json saved" "grep -q '\"steps\": 4' '$out/run_config.json'"
check "4 metrics lines" "[ \$(wc -l < '$out/metrics.jsonl') -eq 4 ]"
for key in step loss lr grad_norm tokens trained_tokens tokens_per_s elapsed_s; do
    check "metrics key $key on every line" "[ \$(grep -c '\"$key\":' '$out/metrics.jsonl') -eq 4 ]"
done
check "eval on steps 2 and 4 only" "[ \"\$(grep -n '\"eval_answer_loss\":' '$out/metrics.jsonl' | cut -d: -f1 | tr '\n' ' ')\" = '2 4 ' ]"
console='^step 4/4 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| gnorm [0-9.]+ \| [0-9]+ tok/s \| [0-9]+ npass-eq tok/s \| MFU n/a \| ETA'
check "console line" "grep -Eq '$console' '$tmp/log'"
loss() { sed -n "${1}p" "$out/metrics.jsonl" | grep -o '"loss":[^,]*' | cut -d: -f2; }
check "loss goes down ($(loss 1) -> $(loss 4))" "awk -v a=$(loss 1) -v b=$(loss 4) 'BEGIN{exit !(b < a - 0.05)}'"
ck="$out/checkpoint-000004"
for f in model.safetensors optimizer.safetensors config.json generation_config.json tokenizer.model; do
    check "checkpoint has $f" "[ -s '$ck/$f' ]"
done
check "no temp files left" "[ -z \"\$(find '$out' -name '*.tmp')\" ]"

# Backend choice: without a usable GPU, backend=cuda fails and says why.
if ! nvidia-smi -L >/dev/null 2>&1; then
    if out_text=$("$train" --set backend=cuda --set out_dir="$tmp/cuda" "${tiny[@]}" 2>&1); then
        bad "backend cuda should fail without a GPU"; else
        check "cuda backend message" "grep -q 'built without CUDA\\|no CUDA device' <<<\"\$out_text\""; fi
fi
if out_text=$("$train" --set backend=tpu --set out_dir="$tmp/tpu" 2>&1); then
    bad "unknown backend should fail"; else
    check "unknown backend named" "grep -q \"'backend'.*tpu\" <<<\"\$out_text\""; fi

# A learning rate of 1e30 blows the weights up: the run stops at the first non-finite
# loss, names the step, and writes no checkpoint for it.
nan="$tmp/nan"
if "$train" --set out_dir="$nan" --set train.steps=6 --set train.lr=1e30 --set train.warmup_steps=0 \
    --set train.checkpoint_every=1 --set eval.every=0 "${tiny[@]}" > "$tmp/nanlog" 2>&1; then
    bad "NaN run should fail"
else
    stop_step=$(grep -o 'error: step [0-9]*' "$tmp/nanlog" | grep -o '[0-9]*$')
    check "NaN stop names the step" "[ -n '$stop_step' ] && grep -Eq 'step $stop_step: (the loss is|non-finite gradient in tensor|the update made weights)' '$tmp/nanlog'"
    check "no checkpoint of the bad step" "[ ! -e '$nan/checkpoint-$(printf %06d "${stop_step:-0}")' ]"
    check "metrics stop before the bad step" "[ \$(wc -l < '$nan/metrics.jsonl') -eq $(( ${stop_step:-1} - 1 )) ]"
fi

# `train parity --json` writes the report (its numbers are checked by test_parity).
if "$train" parity "${tiny[@]}" --set parity.conversations=2 --set data.seq_len=2048 \
    --json "$tmp/parity.json" > "$tmp/plog" 2>&1; then
    check "parity table printed" "grep -q '^duplicate ' '$tmp/plog' && grep -q '^mask_only ' '$tmp/plog'"
    check "parity JSON written" "grep -q '\"grad_rel_diff_max\"' '$tmp/parity.json' && grep -q '\"npass\"' '$tmp/parity.json'"
else
    bad "train parity: $(tail -3 "$tmp/plog")"
fi

# data.tokenizer as a model folder (a tokenizer.json); one without the template's tokens
# is refused naming the folder and the token.
if "$train" --set out_dir="$tmp/bpe" --set train.steps=2 --set eval.every=2 "${tiny[@]}" \
    --set data.tokenizer=tests/data/tokenizers/qwen2 --set model.vocab_size=1501 > "$tmp/blog" 2>&1 &&
   grep -q '^done: 2 steps' "$tmp/blog"; then ok; else bad "run with a tokenizer.json folder: $(tail -3 "$tmp/blog")"; fi
# Its checkpoints carry the folder's tokenizer files.
if cmp -s tests/data/tokenizers/qwen2/tokenizer.json "$tmp/bpe/checkpoint-000002/tokenizer.json"
then ok; else bad "checkpoint lacks the run's tokenizer.json: $(ls "$tmp/bpe"/checkpoint-* 2>&1 | head -3)"; fi
if ! "$train" --set out_dir="$tmp/gpt2" "${tiny[@]}" --set data.tokenizer=tests/data/tokenizers/gpt2 \
    --set model.vocab_size=1501 > "$tmp/glog" 2>&1 &&
   grep -q "tests/data/tokenizers/gpt2: the tokenizer has no id for the template token '<|system|>'" "$tmp/glog"
then ok; else bad "gpt2 tokenizer (no template tokens) not refused: $(tail -2 "$tmp/glog")"; fi

# Tool-use conversations (datasets/tool_use) train under the exact layout, answers only.
if "$train" --set out_dir="$tmp/tools" "${tiny[@]}" --set train.steps=2 --set eval.every=2 \
       --set data.seq_len=2048 --set data.train_path=datasets/tool_use/train.jsonl \
       --set data.eval_path=datasets/tool_use/eval.jsonl --set data.train_on=answer > "$tmp/tlog" 2>&1 &&
   [ "$(wc -l < "$tmp/tools/metrics.jsonl")" -eq 2 ]; then ok
else bad "tool-use run: $(tail -3 "$tmp/tlog")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
