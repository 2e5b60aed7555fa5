#!/usr/bin/env bash
# model.add_tokens: the qwen3 template over the chatml fixture tokenizer, which lacks
# <think>, </think> and the tool tokens. Refused without the key; with it, pack gives the
# rows of the same tokenizer with the tokens added by the reference `tokenizers` package
# (tests/data/add_tokens, scripts/fixtures/make_add_tokens_fixture.py), training from a
# model folder grows the vocabulary, the checkpoint's tokenizer carries the tokens (packing
# with it gives the same rows) and a resume keeps them. The rows' values: test_add_tokens.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
head -n 20 "$data/train.jsonl" > "$tmp/train.jsonl"
head -n 4 "$data/eval.jsonl" > "$tmp/eval.jsonl"
common=(--set data.train_path="$tmp/train.jsonl" --set data.eval_path="$tmp/eval.jsonl" --set data.seq_len=4096)
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=4096 --set train.micro_rows=1 --set train.warmup_steps=1
      --set eval.every=0 --set eval.generate_conversations=0 --set train.checkpoint_every=1)
chatml=tests/data/templates/chatml
add='["<|im_start|>","<think>","</think>","<tool_call>","</tool_call>","<tool_response>","</tool_response>"]'
qwen3=(--set data.chat_template=qwen3 --set data.tokenizer=$chatml)

# Without model.add_tokens: refused, naming the token and the value that adds them all.
expect_error "qwen3 over chatml" "token '<think>'.*model.add_tokens='\[\"<think>\",\"</think>\",\"<tool_call>\",\"</tool_call>\",\"<tool_response>\",\"</tool_response>\"\]'" \
    "$train" pack "${common[@]}" "${qwen3[@]}" --out "$tmp/x.jsonl"
# With it: the reference tokenizer's rows; <|im_start|> is one id already, said in one line.
"$train" pack "${common[@]}" --set data.chat_template=qwen3 --set data.tokenizer=tests/data/add_tokens/tokenizer.json \
    --out "$tmp/ref.jsonl" > "$tmp/ref.log" 2>&1 || bad "pack with the reference: $(tail -2 "$tmp/ref.log")"
if out=$("$train" pack "${common[@]}" "${qwen3[@]}" --set model.add_tokens="$add" --out "$tmp/added.jsonl" 2>&1) &&
   cmp -s "$tmp/ref.jsonl" "$tmp/added.jsonl"; then ok; else bad "pack with model.add_tokens: $(tail -2 <<<"$out")"; fi
if grep -q "'<|im_start|>' is already one id (1502)" <<<"$out"; then ok; else bad "no line for the token present: $out"; fi
if grep -q "'<think>' 3, '</think>' 4, '<tool_call>' 1504" <<<"$out"; then ok; else bad "added ids: $out"; fi

# A model folder of the chatml tokenizer's 1504 rows, untied (random init, one step).
"$train" "${common[@]}" "${tiny[@]}" --set train.steps=1 --set model.vocab_size=1504 \
    --set model.tie_word_embeddings=false --set data.chat_template=chatml --set data.tokenizer=$chatml \
    --set out_dir="$tmp/src" > "$tmp/src.log" 2>&1 || bad "source model: $(tail -2 "$tmp/src.log")"
src="$tmp/src/checkpoint-000001"
from=("${common[@]}" "${tiny[@]}" "${qwen3[@]}" --set model.init_from="$src" --set model.add_tokens="$add"
      --set train.steps=2)
if out=$("$train" "${from[@]}" --set out_dir="$tmp/run" 2>&1) && grep -q '^done: 2 steps' <<<"$out" &&
   grep -q 'vocab 1508)' <<<"$out"; then ok; else bad "train with model.add_tokens: $(tail -3 <<<"$out")"; fi
if grep -q "rows 1504..1507 of the embedding and of lm_head are its mean row" <<<"$out"; then ok; else bad "no mean-row line: $out"; fi
ck="$tmp/run/checkpoint-000002"
if grep -q '"vocab_size": 1508' "$ck/config.json"; then ok; else bad "config.json vocab_size: $(grep vocab "$ck/config.json")"; fi
if grep -q '"content": "</tool_response>"' "$ck/tokenizer.json"; then ok; else bad "tokenizer.json lacks the added tokens"; fi
# The checkpoint's tokenizer has the tokens: the same rows without model.add_tokens.
if "$train" pack "${common[@]}" --set data.chat_template=qwen3 --set data.tokenizer="$ck" --out "$tmp/ck.jsonl" >/dev/null 2>&1 &&
   cmp -s "$tmp/ref.jsonl" "$tmp/ck.jsonl"; then ok; else bad "packing with the checkpoint's tokenizer differs"; fi
# Resume from step 1: the same step-2 weights (the added rows included).
if out=$("$train" "${from[@]}" --set out_dir="$tmp/resumed" --set train.resume="$tmp/run/checkpoint-000001" 2>&1) &&
   cmp -s <(tensor_bytes "$ck/model.safetensors") <(tensor_bytes "$tmp/resumed/checkpoint-000002/model.safetensors")
then ok; else bad "resume: $(tail -3 <<<"$out")"; fi
# A resume with other tokens is refused (model.* is fixed on resume).
expect_error "resume with other tokens" "model.add_tokens" \
    "$train" "${from[@]}" --set out_dir="$tmp/other" --set train.resume="$tmp/run/checkpoint-000001" \
    --set model.add_tokens='["<think>","</think>","<tool_call>","</tool_call>","<tool_response>","</tool_response>","<x>"]'

# A random init grows model.vocab_size to the tokenizer's new size.
if out=$("$train" "${common[@]}" "${tiny[@]}" "${qwen3[@]}" --set model.add_tokens="$add" --set train.steps=1 \
    --set out_dir="$tmp/random" 2>&1) && grep -q 'vocab 1508)' <<<"$out"; then ok; else bad "random init: $(tail -3 <<<"$out")"; fi

# Errors, naming the key.
expect_error "explicit vocab_size" "config key 'model.vocab_size' is 1504 but model.add_tokens grows model.init_from's 1504 rows to the tokenizer's 1508" \
    "$train" "${from[@]}" --set model.vocab_size=1504 --set out_dir="$tmp/x"
expect_error "random init, small vocab_size" "config key 'model.vocab_size' is 1500 but data.tokenizer with model.add_tokens has 1508 pieces" \
    "$train" "${common[@]}" "${tiny[@]}" "${qwen3[@]}" --set model.add_tokens="$add" --set model.vocab_size=1500 --set out_dir="$tmp/x"
expect_error "SentencePiece" "config key 'model.add_tokens': $data/tokenizer.model: a SentencePiece tokenizer cannot take added tokens ('<x>')" \
    "$train" pack "${common[@]}" --set data.tokenizer=$data/tokenizer.model --set model.add_tokens='["<x>"]' --out "$tmp/x.jsonl"
expect_error "empty token" "config key 'model.add_tokens': \[1\] must be a non-empty string" \
    "$train" pack "${common[@]}" "${qwen3[@]}" --set model.add_tokens='["<think>",""]' --out "$tmp/x.jsonl"
expect_error "repeated token" "config key 'model.add_tokens': \[1\] '<think>' repeats \[0\]" \
    "$train" pack "${common[@]}" "${qwen3[@]}" --set model.add_tokens='["<think>","<think>"]' --out "$tmp/x.jsonl"
expect_error "not a list" "config key 'model.add_tokens' must be a list of strings, got a string" \
    "$train" pack "${common[@]}" "${qwen3[@]}" --set model.add_tokens='<think>' --out "$tmp/x.jsonl"
finish
