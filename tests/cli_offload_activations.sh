#!/usr/bin/env bash
# train.offload_activations as the user sets it, on the CPU backend:
#  - without train.recompute=layer it is refused naming both keys, before any step runs;
#  - with it the cpu backend runs, the console says the key changes nothing there, and the
#    metrics and checkpoint bytes equal those of the same run without the key.
# The GPU side (the same bits as train.recompute=layer alone, resume across the modes):
# tests/cli_offload_activations_cuda.sh (it skips without a GPU)
source "$(dirname "$0")/lib_cli.sh"
need_data
source "$(dirname "$0")/lib_metrics.sh"
export OMP_NUM_THREADS=2
run=(--set backend=cpu --set model.num_hidden_layers=2 --set train.steps=2 --set eval.every=0
     --set train.tokens_per_step=512 --set train.micro_rows=2 --set train.checkpoint_every=0
     --set seed=7)
expect_error "offload without recompute layer" "config keys 'train.offload_activations' and 'train.recompute'.*it is 'mlp': set train.recompute=layer" \
    "$train" "${run[@]}" --set out_dir="$tmp/a" --set train.offload_activations=true
[ ! -e "$tmp/a/metrics.jsonl" ] && ok || bad "a refused run wrote metrics"
expect_error "offload with recompute none" "it is 'none'" \
    "$train" "${run[@]}" --set out_dir="$tmp/b" --set train.recompute=none --set train.offload_activations=true
"$train" "${run[@]}" --set out_dir="$tmp/on" --set train.recompute=layer \
    --set train.offload_activations=true > "$tmp/on.log" 2>&1 && ok || bad "offload run: $(tail -3 "$tmp/on.log")"
check "the console says the key changes nothing on cpu" \
    "grep -q \"train.offload_activations: the cpu backend's activations are in host memory already\" '$tmp/on.log'"
"$train" "${run[@]}" --set out_dir="$tmp/off" --set train.recompute=layer > "$tmp/off.log" 2>&1 &&
    ok || bad "run without the key: $(tail -3 "$tmp/off.log")"
check "no note without the key" "! grep -q 'train.offload_activations:' '$tmp/off.log'"
check "two steps' metrics" "[ \$(wc -l < '$tmp/on/metrics.jsonl') -eq 2 ]"
check "the same metrics with and without the key" "diff <(untimed '$tmp/on/metrics.jsonl') <(untimed '$tmp/off/metrics.jsonl') >&2"
tensor_bytes() { tail -c +$((9 + $(od -An -tu8 -N8 "$1" | tr -d ' '))) "$1"; }
check "the same weights with and without the key" \
    "cmp <(tensor_bytes '$tmp/on/checkpoint-000002/model.safetensors') <(tensor_bytes '$tmp/off/checkpoint-000002/model.safetensors')"
finish
