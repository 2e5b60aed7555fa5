#!/usr/bin/env bash
# Smaller things a user meets: `train tokenizer --out` into a folder that does not exist
# yet creates it; `train export` refuses a non-empty --out unless --overwrite (and then
# writes the same folder); `train parity` without --json is refused; `train generate`'s
# lines carry the prompt's index and line, and `tokens` are the ids of `text` (the end of
# turn that stopped it left out of both); with --gpus 2 only rank 0 prints the run's lines.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
head -n 50 "$data/train.jsonl" > "$tmp/corpus.jsonl"
if "$train" tokenizer --corpus-from "$tmp/corpus.jsonl" --out "$tmp/new/folder/tok" > "$tmp/tok.log" 2>&1 &&
   [ -s "$tmp/new/folder/tok.model" ]; then ok; else bad "tokenizer into a new folder: $(tail -2 "$tmp/tok.log")"; fi

tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=1
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=1 --set data.seq_len=1024
      --set eval.every=0 --set backend=cpu --set train.steps=3 --set train.lr=0.01)
"$train" "${tiny[@]}" --set out_dir="$tmp/run" > "$tmp/run.log" 2>&1 || bad "run: $(tail -2 "$tmp/run.log")"
ck="$tmp/run/checkpoint-000003"
"$train" export --from "$ck" --out "$tmp/export" > /dev/null 2>&1 || bad "first export"
expect_error "export over a folder" "train export: --out $tmp/export already holds files; choose another folder, or pass --overwrite" \
    "$train" export --from "$ck" --out "$tmp/export" --dtype f16
if ! grep -q '"F16"' "$tmp/export/model.safetensors"; then ok; else bad "a refused export wrote"; fi
if "$train" export --from "$ck" --out "$tmp/export" --dtype f16 --overwrite > /dev/null 2>&1 &&
   grep -aq '"dtype":"F16"' "$tmp/export/model.safetensors"; then ok; else bad "export --overwrite"; fi
expect_error "parity without --json" "train parity: --json out.json is required" "$train" parity "${tiny[@]}"

# generate: greedy from the trained model; the prompts' own lines.
cat > "$tmp/prompts.jsonl" <<'JSONL'

{"messages":[{"role":"user","content":"Add 12 and 30."}]}
{"conversations":[{"from":"system","value":"Be exact."},{"from":"human","value":"Add 5 and 6."}]}
{"messages":[{"role":"user","content":"Add 7 and 8."},{"role":"assistant","content":"15."},{"role":"user","content":"Add 1."}]}
JSONL
if [ -s "$tmp/prompts.jsonl" ] && "$train" generate "${tiny[@]}" --set model.init_from="$ck" --set generate.max_new_tokens=40 \
    --prompts "$tmp/prompts.jsonl" --out "$tmp/gen.jsonl" > "$tmp/gen.log" 2>&1; then ok; else bad "generate: $(tail -2 "$tmp/gen.log")"; fi
if python3 - "$tmp/gen.jsonl" "$ck" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ok = [l["prompt"] for l in lines] == [0, 1, 2] and [l["line"] for l in lines] == [2, 3, 4]
for l in lines:
    ok &= len(l["tokens"]) <= 40 and (l["stop"] == "length") == (len(l["tokens"]) == 40)
sys.exit(0 if ok else 1)
PY
then ok; else bad "generate lines: $(head -c 300 "$tmp/gen.jsonl")"; fi

# --gpus 2 (CPU ranks): the header lines once.
if "$train" "${tiny[@]}" --gpus 2 --set train.tokens_per_step=2048 --set out_dir="$tmp/two" > "$tmp/two.log" 2>&1; then ok
else bad "two ranks: $(tail -3 "$tmp/two.log")"; fi
for header in "^config: " "^train data: " "^model: "; do
    [ "$(grep -c "$header" "$tmp/two.log")" -eq 1 ] && ok || bad "'$header' printed $(grep -c "$header" "$tmp/two.log") times"
done
finish
