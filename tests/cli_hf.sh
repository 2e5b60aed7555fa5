#!/usr/bin/env bash
# model.init_from: `train run` starts from a Hugging Face folder (the committed Qwen3
# fixture: sharded, bf16); model.* keys that agree with its config.json are accepted,
# contradicting ones are errors naming both values; a folder without config.json is
# refused by name.
train="$1"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
check() { if eval "$2"; then ok; else bad "$1"; fi; }
expect_error() {  # expect_error <description> <pattern> <command...>
    local what="$1" pattern="$2"; shift 2
    if out=$("$@" 2>&1); then bad "$what: exit 0"; return; fi
    if grep -q -- "$pattern" <<<"$out"; then ok; else bad "$what: got: $out"; fi
}
export OMP_NUM_THREADS=2
hf=tests/data/hf/qwen3_qknorm_sharded
small=(--set backend=cpu --set data.tokenizer=datasets/synthetic/tokenizer.model --set train.tokens_per_step=1024 --set train.micro_rows=1
       --set train.warmup_steps=1 --set eval.every=0 --set data.seq_len=1024)

out="$tmp/run"
if "$train" --set model.init_from=$hf --set model.hidden_size=32 --set out_dir="$out" \
    --set train.steps=2 "${small[@]}" > "$tmp/log" 2>&1; then ok; else bad "init_from run: $(tail -3 "$tmp/log")"; fi
check "weights line" "grep -q '^weights: $hf' '$tmp/log'"
check "model from config.json" "grep -q 'model: .*(2 layers, hidden 32, vocab 512)' '$tmp/log'"
first_loss=$(head -1 "$out/metrics.jsonl" | grep -o '"loss":[^,]*' | cut -d: -f2)
# The fixture's random weights give loss ~8.5 on any text; the seeded init gives ln 512 = 6.24.
check "first loss is the checkpoint's ($first_loss)" "awk -v a=$first_loss 'BEGIN{exit !(a > 7.0)}'"

ck="$out/checkpoint-000002"
for f in config.json model.safetensors generation_config.json optimizer.safetensors tokenizer.model; do
    check "checkpoint has $f" "[ -s '$ck/$f' ]"
done
check "one weight file below the shard limit" "[ ! -e '$ck/model.safetensors.index.json' ]"
check "checkpoint weights in bf16 (the default from init_from)" "grep -aq '\"dtype\":\"BF16\"' '$ck/model.safetensors'"
check "checkpoint config.json is qwen3" "grep -q '\"model_type\": \"qwen3\"' '$ck/config.json' && grep -q '\"dtype\": \"bfloat16\"' '$ck/config.json'"
check "generation eos is the template's end of turn" "grep -Eq '\"eos_token_id\": [0-9]+' '$ck/generation_config.json'"
if "$train" export --from "$ck" --out "$tmp/exported" --dtype f32 > "$tmp/export.log" 2>&1; then ok; else bad "export: $(cat "$tmp/export.log")"; fi
check "export has no optimizer state" "[ ! -e '$tmp/exported/optimizer.safetensors' ] && [ -s '$tmp/exported/model.safetensors' ] && [ -s '$tmp/exported/tokenizer.model' ]"
check "export in f32" "grep -aq '\"dtype\":\"F32\"' '$tmp/exported/model.safetensors'"
"$train" export --from "$tmp/exported" --out "$tmp/again" > /dev/null 2>&1
check "export -> export is bit-identical" "cmp -s '$tmp/exported/model.safetensors' '$tmp/again/model.safetensors' && cmp -s '$tmp/exported/config.json' '$tmp/again/config.json'"
expect_error "export bad dtype" "train export: --dtype: dtype 'fp8' is not one of bf16, f16, f32" \
    "$train" export --from "$ck" --out "$tmp/y" --dtype fp8
expect_error "export without --from" "train export: --from and --out are required" "$train" export --out "$tmp/y"
expect_error "bad save_dtype" "config key 'train.save_dtype': dtype 'f64' is not one of bf16, f16, f32" \
    "$train" --set model.init_from=$hf --set train.save_dtype=f64 --set out_dir="$tmp/x" "${small[@]}"

expect_error "contradicting model key" \
    "config key 'model.hidden_size' is 64 but model.init_from $hf/config.json says 32" \
    "$train" --set model.init_from=$hf --set model.hidden_size=64 --set out_dir="$tmp/x" "${small[@]}"
expect_error "contradicting tie" \
    "config key 'model.tie_word_embeddings' is true but model.init_from $hf/config.json says false" \
    "$train" --set model.init_from=$hf --set model.tie_word_embeddings=true --set out_dir="$tmp/x" "${small[@]}"
expect_error "no config.json" \
    "model.init_from': tests/config.json: cannot open (not a Hugging Face model folder)" \
    "$train" --set model.init_from=tests --set out_dir="$tmp/x" "${small[@]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
