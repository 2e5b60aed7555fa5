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
small=(--set backend=cpu --set train.tokens_per_step=1024 --set train.micro_rows=1
       --set train.warmup_steps=1 --set train.eval_every=0 --set data.seq_len=1024)

out="$tmp/run"
if "$train" --set model.init_from=$hf --set model.hidden_size=32 --set out_dir="$out" \
    --set train.steps=2 "${small[@]}" > "$tmp/log" 2>&1; then ok; else bad "init_from run: $(tail -3 "$tmp/log")"; fi
check "weights line" "grep -q '^weights: $hf' '$tmp/log'"
check "model from config.json" "grep -q 'model: .*(2 layers, hidden 32, vocab 512)' '$tmp/log'"
first_loss=$(head -1 "$out/metrics.jsonl" | grep -o '"loss":[^,]*' | cut -d: -f2)
# The fixture's random weights give loss ~8.5 on any text; the seeded init gives ln 512 = 6.24.
check "first loss is the checkpoint's ($first_loss)" "awk -v a=$first_loss 'BEGIN{exit !(a > 7.0)}'"

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
