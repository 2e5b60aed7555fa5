#!/usr/bin/env bash
# Unknown keys and wrong types are errors that name the file and the key; so are values
# out of a key's range, duplicate keys, a BOM, a missing config file and malformed --set.
train="$1"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
expect_error() {  # expect_error <description> <pattern> <command...>
    local what="$1" pattern="$2"; shift 2
    if out=$("$@" 2>&1); then echo "FAIL $what: exit 0"; fail=$((fail+1)); return; fi
    if grep -q -- "$pattern" <<<"$out"; then pass=$((pass+1)); else echo "FAIL $what: got: $out"; fail=$((fail+1)); fi
}
echo '{"data": {"seq_len": 64, "bogus": 1}}' > "$tmp/unknown.json"
expect_error "unknown key in file" "unknown.json: unknown config key 'data.bogus'" "$train" pack --config "$tmp/unknown.json" --out "$tmp/o"
echo '{"data": {"seq_len": "long"}}' > "$tmp/type.json"
expect_error "wrong type" "type.json: config key 'data.seq_len' must be an integer" "$train" pack --config "$tmp/type.json" --out "$tmp/o"
expect_error "unknown --set key" "unknown config key 'train.nope'" "$train" pack --set train.nope=1 --out "$tmp/o"
expect_error "close key suggested" "unknown config key 'train.lrr' (did you mean 'train.lr'?)" "$train" pack --set train.lrr=1 --out "$tmp/o"
echo '{"eval": {"seq_len": 64}}' > "$tmp/section.json"
expect_error "key in the wrong section" "section.json: unknown config key 'eval.seq_len' (did you mean 'data.seq_len'?)" "$train" pack --config "$tmp/section.json" --out "$tmp/o"
echo '{"train": {"eval_every": 5}}' > "$tmp/renamed.json"
expect_error "renamed key in a file" "renamed.json: config key 'train.eval_every' is now 'eval.every'" "$train" pack --config "$tmp/renamed.json" --out "$tmp/o"
expect_error "renamed key in --set" "config key 'train.bucket_mb' is now 'dist.bucket_mb'" "$train" pack --set train.bucket_mb=4 --out "$tmp/o"
expect_error "renamed template key" "config key 'data.template' is now 'data.chat_template'" "$train" pack --set data.template=qwen3 --out "$tmp/o"
echo '{"train": {"keep_mlp_activations": true}}' > "$tmp/replaced.json"
expect_error "replaced key in a file" "replaced.json: config key 'train.keep_mlp_activations' is replaced by 'train.recompute' (true is none, false is mlp)" "$train" pack --config "$tmp/replaced.json" --out "$tmp/o"
echo '{"train": {"lora": {"r": 16, "alpha": 32}}}' > "$tmp/lora_object.json"
expect_error "LoRA as an object under train" "lora_object.json: config key 'train.lora' is replaced by 'lora.r' (the object's r, alpha, targets and rslora are the lora section's keys)" "$train" pack --config "$tmp/lora_object.json" --out "$tmp/o"
expect_error "unknown recompute mode" "config key 'train.recompute': unknown value 'sometimes' (none, mlp, layer)" "$train" run --set train.recompute=sometimes --set backend=cpu --set out_dir="$tmp/run"
expect_error "section set as a key" "'eval' is a section" "$train" pack --set eval=1 --out "$tmp/o"
expect_error "list of non-strings" "config key 'model.add_tokens': \[1\] must be a non-empty string" "$train" pack --set 'model.add_tokens=["a", 3]' --out "$tmp/o"
echo '{"data": ' > "$tmp/bad.json"
expect_error "invalid JSON" "bad.json:.*invalid JSON" "$train" pack --config "$tmp/bad.json" --out "$tmp/o"
# Every key's range: a value outside it is refused with the key named.
while IFS='|' read -r set pattern; do
    expect_error "--set $set" "$pattern" "$train" pack --set "$set" --out "$tmp/o"
done <<'EOF2'
train.lr=-0.1|config key 'train.lr': must be in \[0, 
train.beta1=1.5|config key 'train.beta1': must be in \[0, 1)
train.beta2=-0.5|config key 'train.beta2'
train.eps=-1|config key 'train.eps': must be in (0, 
train.weight_decay=-0.1|config key 'train.weight_decay'
train.grad_clip=-1|config key 'train.grad_clip'
train.warmup_steps=-1|config key 'train.warmup_steps'
eval.every=-5|config key 'eval.every'
train.checkpoint_every=-5|config key 'train.checkpoint_every'
train.min_lr_ratio=1.5|config key 'train.min_lr_ratio': must be in \[0, 1\]
train.tokens_per_step=1000000000000000|config key 'train.tokens_per_step'
train.micro_rows=100000000|config key 'train.micro_rows'
data.seq_len=100000000|config key 'data.seq_len'
model.hidden_size=0|config key 'model.hidden_size'
model.num_hidden_layers=100000|config key 'model.num_hidden_layers'
model.rope_theta=-1|config key 'model.rope_theta'
model.rms_norm_eps=0|config key 'model.rms_norm_eps'
seed=-1|config key 'seed'
eval.max_conversations=-1|config key 'eval.max_conversations'
parity.conversations=0|config key 'parity.conversations'
EOF2
echo '{"train": {"beta1": 1.5}}' > "$tmp/range.json"
expect_error "range in a file" "range.json: config key 'train.beta1': must be in" "$train" pack --config "$tmp/range.json" --out "$tmp/o"
echo '{"train": {"lr": 0.1, "lr": 0.2}}' > "$tmp/dup.json"
expect_error "duplicate key" "dup.json:.*duplicate.*lr" "$train" pack --config "$tmp/dup.json" --out "$tmp/o"
printf '\xef\xbb\xbf{"train": {"lr": 0.1}}\n' > "$tmp/bom.json"
expect_error "BOM" "bom.json: .*byte order mark" "$train" pack --config "$tmp/bom.json" --out "$tmp/o"
expect_error "missing config file" "nope.json: cannot open: No such file" "$train" pack --config "$tmp/nope.json" --out "$tmp/o"
if out=$("$train" pack --config "$tmp/nope.json" --out "$tmp/o" 2>&1) || grep -q -- '-1' <<<"$out"; then
    echo "FAIL missing config file mentions -1: $out"; fail=$((fail+1)); else pass=$((pass+1)); fi
expect_error "config is a directory" "$tmp: not a regular file" "$train" pack --config "$tmp" --out "$tmp/o"
expect_error "empty key part" "--set data..seq_len=64: malformed key 'data..seq_len'" "$train" pack --set data..seq_len=64 --out "$tmp/o"
expect_error "leading dot" "malformed key '.seed'" "$train" pack --set .seed=1 --out "$tmp/o"
# A value that is not UTF-8 (JSON strings are): refused naming the key, not a crash.
expect_error "--set value not UTF-8" "config key 'train.lr': the value is not valid UTF-8" \
    "$train" config --set $'train.lr=0.1\xff'
expect_error "--set string value not UTF-8" "config key 'out_dir': the value is not valid UTF-8" \
    "$train" config --set $'out_dir=runs/\xc3'
expect_error "huge number" "--set train.lr=1e999: config key 'train.lr' must be a finite number, got '1e999'" "$train" pack --set train.lr=1e999 --out "$tmp/o"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
