#!/usr/bin/env bash
# Folders as transformers' save_pretrained writes them today (tests/data/hf_chat/, made by
# scripts/fixtures/make_hf_chat_fixtures.py): the template comes from chat_template.jinja
# (no chat_template key in tokenizer_config.json), a tokenizer_config.json with
# model_max_length 1e30 (an integer beyond int64) is read, and model.add_tokens writes
# into it; the older form (the template in tokenizer_config.json) still works.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
head -n 8 "$data/train.jsonl" > "$tmp/train.jsonl"
common=(--set data.train_path="$tmp/train.jsonl" --set data.seq_len=2048 --set backend=cpu)
for family in qwen3 llama3; do
    folder=tests/data/hf_chat/$family
    if ! grep -q chat_template $folder/tokenizer_config.json && [ -s $folder/chat_template.jinja ] &&
       grep -q '"model_max_length": 1000000000000000019884624838656' $folder/tokenizer_config.json
    then ok; else bad "$family: the fixture is not in today's form"; fi
    if out=$("$train" pack "${common[@]}" --set model.init_from=$folder --out "$tmp/$family.jsonl" 2>&1) &&
       grep -q "chat template $family" <<<"$out"; then ok; else bad "$family: template: $(tail -2 <<<"$out")"; fi
done
# The same folder with the template moved into tokenizer_config.json (the older form).
mkdir -p "$tmp/old"; cp tests/data/hf_chat/llama3/* "$tmp/old/"; rm "$tmp/old/chat_template.jinja"
python3 - "$tmp/old" <<'PY'
import json, sys
d = sys.argv[1]
text = open(d + "/tokenizer_config.json").read().replace("1000000000000000019884624838656", "131072")
c = json.loads(text)
c["chat_template"] = open("tests/data/templates/llama3.jinja").read()
json.dump(c, open(d + "/tokenizer_config.json", "w"))
PY
"$train" pack "${common[@]}" --set model.init_from="$tmp/old" --out "$tmp/old.jsonl" > "$tmp/old.log" 2>&1
if grep -q "chat template llama3" "$tmp/old.log" && cmp -s "$tmp/old.jsonl" "$tmp/llama3.jsonl"; then ok
else bad "older form: $(tail -2 "$tmp/old.log")"; fi
# Without any template the folder gets the onepass template: the refusal says so and asks
# for data.chat_template (not for onepass's tokens); naming it trains.
rm "$tmp/old/tokenizer_config.json"
expect_error "no template" "config key 'data.chat_template': model.init_from $tmp/old has no chat template .* so the onepass template was chosen and .*no id for the template token '<|system|>'.*; set data.chat_template to the model's family" \
    "$train" pack "${common[@]}" --set model.init_from="$tmp/old" --out "$tmp/x.jsonl"
"$train" pack "${common[@]}" --set model.init_from="$tmp/old" --set data.chat_template=llama3 --out "$tmp/named.jsonl" > /dev/null 2>&1
cmp -s "$tmp/named.jsonl" "$tmp/llama3.jsonl" && ok || bad "naming the template"

# model.add_tokens into a folder whose tokenizer_config.json holds 1e30: the qwen3 template
# over the llama3 folder's tokenizer (480 ids + 8 added <= 512 rows), one step.
add='["<|im_start|>","<|im_end|>","<think>","</think>","<tool_call>","</tool_call>","<tool_response>","</tool_response>"]'
if out=$("$train" "${common[@]}" --set model.init_from=tests/data/hf_chat/llama3 --set data.chat_template=qwen3 \
    --set model.add_tokens="$add" --set train.steps=1 --set train.tokens_per_step=2048 --set train.micro_rows=1 \
    --set eval.every=0 --set out_dir="$tmp/run" 2>&1); then ok; else bad "add_tokens run: $(tail -3 <<<"$out")"; fi
ck="$tmp/run/checkpoint-000001"
if python3 -c "
import json, sys
c = json.load(open('$ck/tokenizer_config.json')); t = json.load(open('$ck/tokenizer.json'))
added = {a['content']: a['id'] for a in t['added_tokens']}
sys.exit(not (c['model_max_length'] >= 1e29 and added.get('<|im_start|>') == 480 and added.get('</tool_response>') == 487))
"; then ok; else bad "checkpoint tokenizer files: $(head -c 300 "$ck/tokenizer_config.json")"; fi
finish
