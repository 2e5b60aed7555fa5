#!/usr/bin/env bash
# `train memory`: the GPU and host memory of a CUDA run in each mode, on a machine without
# a GPU, at Qwen3-8B's shape (configs/bench_qwen3_8b.json, config.json only). The state
# and host columns against the byte counts written out here from the parameter count
# (the count by hand, as tests/test_device_memory.c has it): 16 bytes a parameter and two
# norms on the GPU, 6 with the offloaded optimizer; on the host the state's 12-byte copy,
# or with the offloaded optimizer its 12 pinned bytes and the two rings of 2^24 elements
# (4 + 2 bytes). The fit columns follow --gpu-gib and --host-gib, the first mode that fits
# both is named, and with too little host memory none is; LoRA has no offloaded-optimizer
# rows; bad flags are refused naming them; without a GPU --gpu-gib is asked for.
source "$(dirname "$0")/lib_cli.sh"
cfg=(--config configs/bench_qwen3_8b.json --set data.seq_len=16384 --set train.micro_rows=1)
n=$((2 * 151936 * 4096 + 4096 + 36 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128)))
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }
full=$(gib $((16 * n + 8))) offloaded=$(gib $((6 * n + 8)))
copy=$(gib $((12 * n))) pinned=$(gib $((12 * n + 6 * 2 * 16777216)))
"$train" memory "${cfg[@]}" --gpu-gib 79 --host-gib 125 > "$tmp/plan" 2>&1 || bad "train memory: $(tail -3 "$tmp/plan")"
row() { grep "^| recompute=$1 |" "$tmp/plan" | tr -d ' ' | cut -d'|' -f"$2"; }  # MODE COLUMN
check "8190735360 parameters" "grep -q '^model: 8190735360 parameters' '$tmp/plan'"
check "7 modes" "[ \$(grep -c '^| recompute=' '$tmp/plan') -eq 7 ]"
check "the config's mode (mlp) marked" "grep -q '^| recompute=mlp (the config.s) |' '$tmp/plan'"
check "GPU state $full without the offload" "[ '$(row none 3)' = $full ] && [ '$(row layer 3)' = $full ]"
check "GPU state $offloaded offloaded" "[ '$(row 'layer, offload_optimizer' 3)' = $offloaded ]"
check "host $copy: the state's copy" "[ '$(row layer 8)' = $copy ] && [ '$(row layer 7)' = 0.00 ]"
check "host $pinned pinned with the offloaded optimizer" \
    "[ '$(row 'layer, offload_optimizer' 7)' = $pinned ] && [ '$(row 'layer, offload_optimizer' 8)' = $pinned ]"
check "layer + offloaded optimizer fits 79 GiB, none does not" \
    "[ '$(row 'layer, offload_optimizer' 9)' = yes ] && [ '$(row none 9)' = no ]"
first=$(awk -F'|' '/^\| recompute=/ && $9 ~ /yes/ && $10 ~ /yes/ { sub(/ \(the config.s\)/, "", $2); gsub(/^ +| +$/, "", $2); print $2; exit }' "$tmp/plan")
check "the first mode that fits both is named ($first)" \
    "[ -n '$first' ] && grep -q '^The first mode that fits both: $first (' '$tmp/plan'"
"$train" memory "${cfg[@]}" --gpu-gib 79 --host-gib 50 > "$tmp/small" 2>&1
check "50 GiB of host: no mode fits, said so" "grep -q '^No mode fits' '$tmp/small' && ! grep -q 'fits both' '$tmp/small'"
"$train" memory "${cfg[@]}" --set lora.r=16 --gpu-gib 79 --host-gib 125 > "$tmp/lora" 2>&1
check "LoRA: 4 modes, none with the offloaded optimizer" \
    "[ \$(grep -c '^| recompute=' '$tmp/lora') -eq 4 ] && ! grep -q offload_optimizer '$tmp/lora'"
expect_error "--gpu-gib 0" "memory: --gpu-gib wants a size in GiB" "$train" memory "${cfg[@]}" --gpu-gib 0
expect_error "an unknown flag" "memory: unexpected argument '--gpus'" "$train" memory "${cfg[@]}" --gpus 2
expect_error "an unknown key" "unknown config key" "$train" memory "${cfg[@]}" --set train.recompue=layer
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then ok  # a GPU here gives the default
else expect_error "no GPU, no --gpu-gib" "no GPU is visible here.*--gpu-gib" "$train" memory "${cfg[@]}"; fi
finish
