#!/usr/bin/env bash
# `train pack` and `train` with each chat template (data.chat_template) and its fixture model
# folder (tests/data/templates/NAME: a tokenizer.json with the family's tokens and the
# official chat_template) on the shipped data; the default template from the folder's
# chat_template; the errors for an unknown name and an unrecognised chat_template.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
head -n 40 "$data/train.jsonl" > "$tmp/train.jsonl"
head -n 8 "$data/eval.jsonl" > "$tmp/eval.jsonl"
common=(--set data.train_path="$tmp/train.jsonl" --set data.eval_path="$tmp/eval.jsonl"
        --set data.seq_len=4096 --set model.vocab_size=1536)
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=4096 --set train.micro_rows=1 --set train.warmup_steps=1
      --set eval.max_conversations=2 --set train.steps=2 --set eval.every=2)
for name in qwen3 deepseek_r1 chatml qwen2.5 smollm2 llama3 zephyr onepass; do
    folder=tests/data/templates/$name
    if out=$("$train" pack "${common[@]}" --set data.tokenizer="$folder" --set data.chat_template="$name" \
        --out "$tmp/$name.jsonl" 2>&1); then ok; else bad "pack $name: $(tail -2 <<<"$out")"; fi
    # The folder's chat_template gives the same template (onepass's folder has none: the default).
    if "$train" pack "${common[@]}" --set data.tokenizer="$folder" --out "$tmp/$name.auto.jsonl" >/dev/null 2>&1 &&
       cmp -s "$tmp/$name.jsonl" "$tmp/$name.auto.jsonl"; then ok; else bad "$name: the folder's default template differs"; fi
    if out=$("$train" "${common[@]}" "${tiny[@]}" --set data.tokenizer="$folder/tokenizer.json" \
        --set data.chat_template="$name" --set out_dir="$tmp/run-$name" 2>&1) && grep -q '^done: 2 steps' <<<"$out"
    then ok; else bad "train $name: $(tail -2 <<<"$out")"; fi
done
# The templates render differently: the qwen3 and llama3 rows share no line.
if ! cmp -s "$tmp/qwen3.jsonl" "$tmp/llama3.jsonl"; then ok; else bad "qwen3 and llama3 rows are identical"; fi

expect_error "unknown template" "config key 'data.chat_template': unknown template 'llama2' (qwen3, deepseek_r1" \
    "$train" pack "${common[@]}" --set data.tokenizer=tests/data/templates/qwen3 --set data.chat_template=llama2 --out "$tmp/x.jsonl"
mkdir "$tmp/odd"
cp tests/data/templates/chatml/tokenizer.json "$tmp/odd/"
echo '{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}' > "$tmp/odd/tokenizer_config.json"
expect_error "unrecognised chat_template" "config key 'data.tokenizer': $tmp/odd: the chat_template of this model folder is not one onepass knows; set data.chat_template" \
    "$train" pack "${common[@]}" --set data.tokenizer="$tmp/odd" --out "$tmp/x.jsonl"
if "$train" pack "${common[@]}" --set data.tokenizer="$tmp/odd" --set data.chat_template=chatml --out "$tmp/odd.jsonl" >/dev/null 2>&1 &&
   cmp -s "$tmp/odd.jsonl" "$tmp/chatml.jsonl"; then ok; else bad "data.chat_template overrides an unrecognised chat_template"; fi
# A tokenizer without the template's tokens is refused, naming the token.
expect_error "llama3 template, qwen3 tokenizer" "the tokenizer has no id for the template token '<|begin_of_text|>'" \
    "$train" pack "${common[@]}" --set data.tokenizer=tests/data/templates/qwen3 --set data.chat_template=llama3 --out "$tmp/x.jsonl"

# Tool use (datasets/tool_use) under qwen3 packs and trains; a template without tool support
# refuses it, naming the field.
tools=(--set data.train_path=datasets/tool_use/train.jsonl --set data.eval_path=datasets/tool_use/eval.jsonl
       --set data.seq_len=4096 --set model.vocab_size=1536 --set data.tokenizer=tests/data/templates/qwen3)
if out=$("$train" pack "${tools[@]}" --set data.chat_template=qwen3 --out "$tmp/tools.jsonl" 2>&1) && [ -s "$tmp/tools.jsonl" ]
then ok; else bad "pack qwen3 tool use: $(tail -2 <<<"$out")"; fi
if out=$("$train" "${tools[@]}" "${tiny[@]}" --set data.chat_template=qwen3 --set out_dir="$tmp/run-tools" 2>&1) &&
   grep -q '^done: 2 steps' <<<"$out"; then ok; else bad "train qwen3 tool use: $(tail -2 <<<"$out")"; fi
expect_error "llama3 with tool calls" \
    "train.jsonl:1: messages\[2\].tool_calls: the llama3 template is not supported with tool calls here" \
    "$train" pack "${tools[@]}" --set data.tokenizer=tests/data/templates/llama3 --set data.chat_template=llama3 --out "$tmp/x.jsonl"
finish
