#!/usr/bin/env bash
# LoRA as the user runs it (lora.r on a model.init_from folder, the CPU backend):
# every checkpoint is a PEFT adapter folder (adapter_config.json with PEFT's keys,
# adapter_model.safetensors under PEFT's names and shapes, no model weights); a resume
# from the middle gives the straight run's metrics and adapter bytes; the base folder is
# never written, and a resume on a changed base is refused by its checksum; `train export`
# writes the adapter folder, and `--merge` the full model whose weights are
# W + alpha/r B A, checked here in plain Python from the files; lora.init_from of an
# exported adapter folder starts from its adapters, and one of other settings is refused.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
base="$tmp/base"; cp -r tests/data/hf_chat/qwen3 "$base"
base_sum=$(cat "$base"/* | cksum)
run=(--config configs/finetune.json --set model.init_from="$base" --set lora.r=4 --set lora.alpha=8
     --set 'lora.targets=["q_proj","o_proj","up_proj","down_proj"]' --set train.steps=4
     --set train.tokens_per_step=1024 --set data.seq_len=1024 --set data.skip_too_long=true
     --set train.checkpoint_every=2 --set eval.every=2 --set eval.max_conversations=2
     --set train.lr=1e-2 --set train.warmup_steps=1 --set backend=cpu)
header() { head -c $((8 + $(od -An -tu8 -N8 "$1" | tr -d ' '))) "$1" | tail -c +9; }

"$train" "${run[@]}" --set out_dir="$tmp/a" > "$tmp/a.log" 2>&1 && ok || bad "lora run: $(tail -3 "$tmp/a.log")"
ck="$tmp/a/checkpoint-000004"
if [ -f "$ck/adapter_config.json" ] && [ -f "$ck/adapter_model.safetensors" ] &&
   [ ! -e "$ck/model.safetensors" ] && [ ! -e "$ck/config.json" ]; then ok; else bad "checkpoint files: $(ls "$ck")"; fi
python3 - "$ck/adapter_config.json" "$(realpath "$base")" <<'EOF' && ok || bad "adapter_config.json"
import json, sys
c = json.load(open(sys.argv[1]))
want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "bias": "none",
        "use_rslora": False, "base_model_name_or_path": sys.argv[2]}
bad = {k: c.get(k) for k in want if c.get(k) != want[k]}
if sorted(c["target_modules"]) != sorted(["q_proj", "o_proj", "up_proj", "down_proj"]):
    bad["target_modules"] = c["target_modules"]
if bad: sys.exit(str(bad))
EOF
# PEFT's names and shapes: [r, in] and [out, r], 2 layers x 4 targets x (A, B).
python3 - "$ck/adapter_model.safetensors" <<'EOF' && ok || bad "adapter tensors"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
h.pop("__metadata__")
want = {}
for l in range(2):
    for mod, name, i, o in [("self_attn", "q_proj", 32, 64), ("self_attn", "o_proj", 64, 32),
                            ("mlp", "up_proj", 32, 64), ("mlp", "down_proj", 64, 32)]:
        p = f"base_model.model.model.layers.{l}.{mod}.{name}."
        want[p + "lora_A.weight"] = [4, i]
        want[p + "lora_B.weight"] = [o, 4]
got = {k: v["shape"] for k, v in h.items()}
if got != want: sys.exit(str(sorted(set((k, tuple(v)) for k, v in got.items()) ^ set((k, tuple(v)) for k, v in want.items()))))
EOF
if grep -q '"eval_loss":[0-9]' "$tmp/a/metrics.jsonl" &&
   [ "$(sed -n 1p "$tmp/a/metrics.jsonl" | grep -o '"loss":[^,]*')" != "$(sed -n 4p "$tmp/a/metrics.jsonl" | grep -o '"loss":[^,]*')" ]
then ok; else bad "the loss does not move"; fi

# Resume from the middle: the straight run's metrics and adapter bytes.
"$train" "${run[@]}" --set out_dir="$tmp/b" --set train.resume="$tmp/a/checkpoint-000002" > "$tmp/b.log" 2>&1 \
    && ok || bad "resumed run: $(tail -3 "$tmp/b.log")"
. "$(dirname "$0")/lib_metrics.sh"
if diff <(sed -n '3,4p' "$tmp/a/metrics.jsonl" | untimed) <(untimed "$tmp/b/metrics.jsonl") >&2; then ok; else bad "resumed metrics"; fi
if cmp <(tensor_bytes "$ck/adapter_model.safetensors") <(tensor_bytes "$tmp/b/checkpoint-000004/adapter_model.safetensors") &&
   cmp <(tensor_bytes "$ck/optimizer.safetensors") <(tensor_bytes "$tmp/b/checkpoint-000004/optimizer.safetensors")
then ok; else bad "resumed adapters or moments differ"; fi
if [ "$(cat "$base"/* | cksum)" = "$base_sum" ]; then ok; else bad "the base folder changed"; fi

# The same path with other base weights: refused by the base checksum.
cp -r "$base" "$tmp/base_saved"
python3 - "$base/model-00001-of-00002.safetensors" <<'EOF'
import struct, sys
f = open(sys.argv[1], "r+b"); n = struct.unpack("<Q", f.read(8))[0]
f.seek(8 + n + 100); b = f.read(1); f.seek(8 + n + 100); f.write(bytes([b[0] ^ 1]))
EOF
expect_error "resume on another base" "trained on base weights of checksum" \
    "$train" "${run[@]}" --set out_dir="$tmp/c" --set train.resume="$tmp/a/checkpoint-000002"
rm -rf "$base"; mv "$tmp/base_saved" "$base"

# Export: the adapter folder, and merged into the base: W + (alpha / r) B A.
"$train" export --from "$ck" --out "$tmp/adapter" > /dev/null && ok || bad "export"
if [ -f "$tmp/adapter/adapter_config.json" ] && [ ! -e "$tmp/adapter/optimizer.safetensors" ] &&
   cmp <(tensor_bytes "$ck/adapter_model.safetensors") <(tensor_bytes "$tmp/adapter/adapter_model.safetensors")
then ok; else bad "exported adapter folder: $(ls "$tmp/adapter")"; fi
"$train" export --from "$ck" --out "$tmp/merged" --merge --dtype f32 > "$tmp/m.log" 2>&1 && ok || bad "export --merge: $(cat "$tmp/m.log")"
python3 - "$base" "$ck/adapter_model.safetensors" "$tmp/merged/model.safetensors" <<'EOF' && ok || bad "merged weights"
import json, struct, sys
def load(path):
    f = open(path, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]; raw = d[a:b]
        if v["dtype"] == "F32": vals = list(struct.unpack(f"<{len(raw)//4}f", raw))
        else: vals = [struct.unpack("<f", struct.pack("<I", x << 16))[0] for x in struct.unpack(f"<{len(raw)//2}H", raw)]
        out[k] = (v["shape"], vals)
    return out
idx = json.load(open(sys.argv[1] + "/model.safetensors.index.json"))["weight_map"]
base = {}
for shard in set(idx.values()): base.update(load(sys.argv[1] + "/" + shard))
ad, merged = load(sys.argv[2]), load(sys.argv[3])
worst = 0.0
for name in ["model.layers.1.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"]:
    (o, i), w = base[name]
    p = "base_model.model." + name.replace(".weight", "")
    _, A = ad[p + ".lora_A.weight"]; _, B = ad[p + ".lora_B.weight"]
    _, m = merged[name]
    for r in range(o):
        for c in range(i):
            want = w[r * i + c] + 8 / 4 * sum(B[r * 4 + k] * A[k * i + c] for k in range(4))
            worst = max(worst, abs(m[r * i + c] - want))
untouched = "model.layers.0.self_attn.k_proj.weight"
if worst > 1e-5 or merged[untouched][1] != base[untouched][1]: sys.exit(f"worst {worst}")
if all(x == 0 for x in ad["base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"][1]): sys.exit("B still zero")
EOF

# train generate with lora.init_from (base + the checkpoint's adapters) generates what the
# merged model folder generates.
printf '%s\n' '{"messages":[{"role":"user","content":"Add 12 and 30."}]}' \
    '{"messages":[{"role":"user","content":"Add 7 and 8."}]}' > "$tmp/prompts.jsonl"
"$train" generate "${run[@]}" --set lora.init_from="$ck" --set generate.max_new_tokens=12 \
    --prompts "$tmp/prompts.jsonl" --out "$tmp/g_lora.jsonl" > "$tmp/g1.log" 2>&1 && ok || bad "generate: $(tail -3 "$tmp/g1.log")"
"$train" generate "${run[@]}" --set lora.r=0 --set model.init_from="$tmp/merged" --set generate.max_new_tokens=12 \
    --prompts "$tmp/prompts.jsonl" --out "$tmp/g_merged.jsonl" > "$tmp/g2.log" 2>&1 && ok || bad "generate merged: $(tail -3 "$tmp/g2.log")"
if [ -s "$tmp/g_lora.jsonl" ] && cmp -s "$tmp/g_lora.jsonl" "$tmp/g_merged.jsonl"; then ok; else bad "generations differ"; fi

# lora.init_from: the exported adapters are the run's start (its first loss is not the
# fresh adapters').
"$train" "${run[@]}" --set out_dir="$tmp/d" --set train.steps=1 --set lora.init_from="$tmp/adapter" > "$tmp/d.log" 2>&1 \
    && ok || bad "lora.init_from: $(tail -3 "$tmp/d.log")"
if grep -q "from $tmp/adapter" "$tmp/d.log" &&
   [ "$(sed -n 1p "$tmp/d/metrics.jsonl" | grep -o '"loss":[^,]*')" != "$(sed -n 1p "$tmp/a/metrics.jsonl" | grep -o '"loss":[^,]*')" ]
then ok; else bad "lora.init_from did not start from the adapters"; fi
# A PEFT-made adapter (tests/data/peft/qwen3_all fits this base's shapes) as lora.init_from,
# at lr 0: its eval loss through base + adapter is the eval loss of the full model that
# `train export --merge` makes of it (another path: the merged weights' forward).
peft_run=("${run[@]}" --set lora.alpha=8 --set lora.targets=[] --set lora.init_from=tests/data/peft/qwen3_all
          --set train.steps=1 --set train.lr=0 --set eval.every=1)
"$train" "${peft_run[@]}" --set out_dir="$tmp/p" > "$tmp/p.log" 2>&1 && ok || bad "PEFT adapter run: $(tail -3 "$tmp/p.log")"
"$train" export --from tests/data/peft/qwen3_all --base "$base" --merge --dtype f32 --out "$tmp/pm" > /dev/null 2>&1 \
    && ok || bad "export --merge of the PEFT adapter"
"$train" "${run[@]}" --set lora.r=0 --set model.init_from="$tmp/pm" --set data.tokenizer="$base" \
    --set train.steps=1 --set train.lr=0 --set eval.every=1 --set out_dir="$tmp/pf" > "$tmp/pf.log" 2>&1 && ok || bad "merged run: $(tail -3 "$tmp/pf.log")"
python3 - "$tmp/p/metrics.jsonl" "$tmp/pf/metrics.jsonl" <<'EOF2' && ok || bad "eval loss through the adapter vs merged"
import json, sys
a, b = (json.loads(open(p).readline())["eval_loss"] for p in sys.argv[1:])
if abs(a - b) > 1e-5 * abs(b): sys.exit(f"adapter {a} merged {b}")
EOF2
# Two ranks (CPU, TCP): the adapters' gradients summed over the ranks give the one-rank
# run's losses.
dp=("${run[@]}" --set train.steps=2 --set eval.every=0 --set train.micro_rows=1 --set train.checkpoint_every=0)
"$train" --gpus 2 "${dp[@]}" --set out_dir="$tmp/dp2" > "$tmp/dp2.log" 2>&1 && ok || bad "2 ranks: $(tail -3 "$tmp/dp2.log")"
"$train" "${dp[@]}" --set out_dir="$tmp/dp1" > "$tmp/dp1.log" 2>&1 && ok || bad "1 rank: $(tail -3 "$tmp/dp1.log")"
if [ "$(grep -o '"loss":[^,]*' "$tmp/dp2/metrics.jsonl")" = "$(grep -o '"loss":[^,]*' "$tmp/dp1/metrics.jsonl")" ] &&
   [ -s "$tmp/dp1/metrics.jsonl" ]; then ok; else bad "2 ranks' losses differ from one rank's"; fi
expect_error "lora.init_from of another rank" "differs from the lora.\* keys: r 4 vs lora.r 8" \
    "$train" "${run[@]}" --set out_dir="$tmp/e" --set lora.r=8 --set lora.init_from="$tmp/adapter"
expect_error "LoRA without a base" "set model.init_from" \
    "$train" --set lora.r=4 --set out_dir="$tmp/f" --set backend=cpu
expect_error "an unknown target" "'qkv_proj' is not one of" \
    "$train" "${run[@]}" --set out_dir="$tmp/g" --set 'lora.targets=["qkv_proj"]'
expect_error "LoRA with the offloaded optimizer" "'lora.r' and 'train.offload_optimizer'" \
    "$train" "${run[@]}" --set out_dir="$tmp/h" --set train.offload_optimizer=true
[ ! -e "$tmp/h/metrics.jsonl" ] && ok || bad "a refused LoRA run with offload wrote metrics"
# Full fine-tuning on the cpu backend: the key changes nothing, and the console says so.
"$train" --set backend=cpu --set train.steps=1 --set train.offload_optimizer=true \
    --set model.num_hidden_layers=1 --set out_dir="$tmp/i" > "$tmp/i.log" 2>&1 &&
    grep -q "offload_optimizer: the cpu backend's optimizer state is in host memory already" "$tmp/i.log" &&
    ok || bad "offload_optimizer on the cpu backend: $(tail -2 "$tmp/i.log")"
finish
