#!/usr/bin/env bash
# model.init_from a folder with config.json and no weights: the run says it starts from a
# random initialisation and its checkpoint holds finite tensors of config.json's shapes;
# a folder whose weights exist but fail to load is still refused (never replaced by a
# random initialisation).
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
head -n 8 "$data/train.jsonl" > "$tmp/train.jsonl"
src=tests/data/hf_chat/qwen3
shape="$tmp/shape"; mkdir "$shape"
for f in config.json chat_template.jinja generation_config.json tokenizer.json tokenizer_config.json; do
    cp "$src/$f" "$shape/"
done
common=(--set data.train_path="$tmp/train.jsonl" --set data.seq_len=2048 --set backend=cpu
        --set train.steps=2 --set eval.every=0)
if "$train" "${common[@]}" --set model.init_from="$shape" --set out_dir="$tmp/run" > "$tmp/log" 2>&1
then ok; else bad "config.json-only run: $(tail -3 "$tmp/log")"; fi
if grep -q "^weights: none in $shape (config.json only): random initialisation, seed [0-9]*$" "$tmp/log"
then ok; else bad "console names the random initialisation: $(grep weights "$tmp/log")"; fi
if grep -q '^step 2/2 ' "$tmp/log"; then ok; else bad "two steps trained"; fi
# The checkpoint's tensors: each of the shape config.json gives, all finite.
if msg=$(python3 - "$shape/config.json" "$tmp/run/checkpoint-000002/model.safetensors" <<'PY'
import json, math, struct, sys
c = json.load(open(sys.argv[1]))
h, v, i, L = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_hidden_layers"]
nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
hd = c.get("head_dim", h // nh)
want = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
if not c.get("tie_word_embeddings", False): want["lm_head.weight"] = [v, h]
for l in range(L):
    p = f"model.layers.{l}."
    want.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                 p + "self_attn.q_proj.weight": [nh * hd, h], p + "self_attn.k_proj.weight": [nkv * hd, h],
                 p + "self_attn.v_proj.weight": [nkv * hd, h], p + "self_attn.o_proj.weight": [h, nh * hd],
                 p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                 p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                 p + "mlp.down_proj.weight": [h, i]})
raw = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n]); head.pop("__metadata__", None)
got = {k: t["shape"] for k, t in head.items()}
if got != want:
    sys.exit("tensors differ: missing %s, extra %s, shapes %s" % (sorted(set(want) - set(got)), sorted(set(got) - set(want)),
             [(k, got[k], want[k]) for k in want if k in got and got[k] != want[k]]))
body = raw[8 + n:]
for k, t in head.items():
    a, b = t["data_offsets"]
    if t["dtype"] == "F32": vals = struct.unpack("<%df" % ((b - a) // 4), body[a:b])
    elif t["dtype"] == "BF16":
        vals = [struct.unpack("<f", b"\0\0" + body[j:j + 2])[0] for j in range(a, b, 2)]
    else: sys.exit("unexpected dtype " + t["dtype"])
    if not all(math.isfinite(x) for x in vals): sys.exit(k + " is not finite")
    if k.endswith("proj.weight") and max(abs(x) for x in vals) == 0: sys.exit(k + " is all zero")
PY
); then ok; else bad "checkpoint tensors: $msg"; fi

# Weights that exist but do not load stay a refusal.
broken="$tmp/broken"; cp -r "$shape" "$broken"
head -c 100 "$src/model-00001-of-00002.safetensors" > "$broken/model.safetensors"
expect_error "a truncated model.safetensors" "loading weights: $broken/model.safetensors" \
    "$train" "${common[@]}" --set model.init_from="$broken" --set out_dir="$tmp/broken_run"
shard="$tmp/shard"; cp -r "$shape" "$shard"; cp "$src/model-00001-of-00002.safetensors" "$shard/"
expect_error "a shard without its index" "loading weights: $shard/model.safetensors" \
    "$train" "${common[@]}" --set model.init_from="$shard" --set out_dir="$tmp/shard_run"
bin="$tmp/bin"; cp -r "$shape" "$bin"; echo "not safetensors" > "$bin/pytorch_model.bin"
expect_error "pytorch_model.bin only" "loading weights: $bin/model.safetensors" \
    "$train" "${common[@]}" --set model.init_from="$bin" --set out_dir="$tmp/bin_run"
for d in broken_run shard_run bin_run; do
    if [ ! -e "$tmp/$d/checkpoint-000002" ]; then ok; else bad "$d trained"; fi
done
finish
