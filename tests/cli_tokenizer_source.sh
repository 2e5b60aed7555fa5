#!/usr/bin/env bash
# The tokenizer of a fine-tune is model.init_from's own: with no data.tokenizer the run
# packs the rows that folder's tokenizer gives and its checkpoint carries that tokenizer
# alone; a data.tokenizer naming another one is refused naming both (nothing written)
# unless data.tokenizer_override is set; a folder without a tokenizer needs one named; a
# tokenizer with more ids than the weights' rows (model.add_tokens or not), or without a
# token id the folder's config.json or generation_config.json names, is refused.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
qwen=tests/data/hf_chat/qwen3
head -n 16 "$data/train.jsonl" > "$tmp/train.jsonl"
head -n 4 "$data/eval.jsonl" > "$tmp/eval.jsonl"
common=(--set data.train_path="$tmp/train.jsonl" --set data.eval_path="$tmp/eval.jsonl" --set data.seq_len=2048
        --set train.tokens_per_step=2048 --set train.micro_rows=1 --set train.warmup_steps=1 --set eval.every=0
        --set backend=cpu)

# No data.tokenizer: the folder's. Its rows are those of naming the folder as data.tokenizer.
"$train" pack "${common[@]}" --set model.init_from=$qwen --out "$tmp/own.jsonl" > "$tmp/own.log" 2>&1 ||
    bad "pack from the folder: $(tail -2 "$tmp/own.log")"
"$train" pack "${common[@]}" --set data.tokenizer=$qwen --out "$tmp/named.jsonl" > /dev/null 2>&1
if [ -s "$tmp/own.jsonl" ] && cmp -s "$tmp/own.jsonl" "$tmp/named.jsonl"; then ok; else bad "rows differ from the folder's tokenizer's"; fi
"$train" pack "${common[@]}" --out "$tmp/synthetic.jsonl" > /dev/null 2>&1
if ! cmp -s "$tmp/own.jsonl" "$tmp/synthetic.jsonl"; then ok; else bad "the folder's rows are the synthetic tokenizer's"; fi
if grep -q "tokenizer $qwen, chat template qwen3" "$tmp/own.log"; then ok; else bad "tokenizer line: $(cat "$tmp/own.log")"; fi
# The same file named as data.tokenizer is the folder's.
"$train" pack "${common[@]}" --set model.init_from=$qwen --set data.tokenizer=$qwen/tokenizer.json --out "$tmp/file.jsonl" > /dev/null 2>&1
if cmp -s "$tmp/own.jsonl" "$tmp/file.jsonl"; then ok; else bad "the folder's own tokenizer.json named"; fi

# A run: its checkpoint carries the folder's tokenizer and nothing else.
if "$train" "${common[@]}" --set model.init_from=$qwen --set train.steps=1 --set out_dir="$tmp/run" > "$tmp/run.log" 2>&1
then ok; else bad "train from the folder: $(tail -3 "$tmp/run.log")"; fi
ck="$tmp/run/checkpoint-000001"
if cmp -s "$ck/tokenizer.json" $qwen/tokenizer.json && [ ! -e "$ck/tokenizer.model" ]; then ok
else bad "checkpoint tokenizer: $(ls "$ck")"; fi

# The README's old fine-tune command: configs/strip_thinking.json names the synthetic tokenizer.
expect_error "another tokenizer" "config key 'data.tokenizer': datasets/synthetic/tokenizer.model is not the tokenizer of model.init_from ($qwen/tokenizer.json).*data.tokenizer_override=true" \
    "$train" --config configs/strip_thinking.json --set model.init_from=$qwen --set out_dir="$tmp/refused"
if [ ! -e "$tmp/refused" ]; then ok; else bad "a refused run wrote its out_dir"; fi
# Said explicitly: accepted, and the checkpoint carries only the tokenizer the run used.
if "$train" "${common[@]}" --set model.init_from=$qwen --set data.tokenizer=$data/tokenizer.model \
    --set data.tokenizer_override=true --set data.chat_template=onepass --set train.steps=1 \
    --set out_dir="$tmp/override" > "$tmp/override.log" 2>&1; then ok; else bad "override: $(tail -3 "$tmp/override.log")"; fi
ck="$tmp/override/checkpoint-000001"
if cmp -s "$ck/tokenizer.model" $data/tokenizer.model && [ ! -e "$ck/tokenizer.json" ]; then ok
else bad "override checkpoint tokenizer: $(ls "$ck")"; fi

# A folder without a tokenizer: data.tokenizer must be named.
expect_error "no tokenizer in the folder" "config key 'model.init_from': tests/data/hf/qwen3_qknorm_sharded has no tokenizer.json or tokenizer.model; set data.tokenizer" \
    "$train" "${common[@]}" --set model.init_from=tests/data/hf/qwen3_qknorm_sharded --set out_dir="$tmp/x"

# More ids than the weights' 512 rows: refused, with model.add_tokens too.
expect_error "1504 ids on 512 rows" "config key 'data.tokenizer': tests/data/templates/chatml has 1504 token ids but model.init_from $qwen has 512 embedding rows" \
    "$train" "${common[@]}" --set model.init_from=$qwen --set data.tokenizer=tests/data/templates/chatml \
    --set data.tokenizer_override=true --set data.chat_template=chatml --set out_dir="$tmp/x"
expect_error "add_tokens on 512 rows" "has 1504 token ids but model.init_from $qwen has 512 embedding rows" \
    "$train" "${common[@]}" --set model.init_from=$qwen --set data.tokenizer=tests/data/templates/chatml \
    --set data.tokenizer_override=true --set data.chat_template=qwen3 \
    --set model.add_tokens='["<think>","</think>","<tool_call>","</tool_call>","<tool_response>","</tool_response>"]' --set out_dir="$tmp/x"

# Token ids of config.json / generation_config.json the tokenizer lacks.
mkdir -p "$tmp/eos" "$tmp/gen"
cp $qwen/* "$tmp/eos/"; cp $qwen/* "$tmp/gen/"
sed -i 's/"eos_token_id": 2/"eos_token_id": 151645/' "$tmp/eos/config.json"
sed -i 's/"eos_token_id": 2/"eos_token_id": [2, 151643]/' "$tmp/gen/generation_config.json"
expect_error "config.json eos" "config key 'data.tokenizer': $tmp/eos has no token id 151645, which model.init_from's $tmp/eos/config.json names as eos_token_id" \
    "$train" "${common[@]}" --set model.init_from="$tmp/eos" --set out_dir="$tmp/x"
expect_error "generation_config.json eos" "has no token id 151643, which model.init_from's $tmp/gen/generation_config.json names as eos_token_id" \
    "$train" "${common[@]}" --set model.init_from="$tmp/gen" --set out_dir="$tmp/x"

# A random init takes its vocabulary from the tokenizer unless model.vocab_size is given.
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=1 --set train.steps=1
      --set data.tokenizer=tests/data/templates/chatml --set data.chat_template=chatml)
if "$train" "${common[@]}" "${tiny[@]}" --set out_dir="$tmp/derived" > "$tmp/derived.log" 2>&1 &&
   grep -q '"vocab_size": 1504' "$tmp/derived/checkpoint-000001/config.json"; then ok; else bad "derived vocab: $(tail -2 "$tmp/derived.log")"; fi
if "$train" "${common[@]}" "${tiny[@]}" --set model.vocab_size=1536 --set out_dir="$tmp/given" > "$tmp/given.log" 2>&1 &&
   grep -q '"vocab_size": 1536' "$tmp/given/checkpoint-000001/config.json"; then ok; else bad "given vocab: $(tail -2 "$tmp/given.log")"; fi
expect_error "given too small" "config key 'model.vocab_size': 512 is smaller than the tokenizer's 1504 pieces" \
    "$train" "${common[@]}" "${tiny[@]}" --set model.vocab_size=512 --set out_dir="$tmp/x"
finish
