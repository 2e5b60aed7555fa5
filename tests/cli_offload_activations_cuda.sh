#!/usr/bin/env bash
# `train` with train.offload_activations on the GPU (exit 77 "SKIP: no CUDA device" without
# a GPU or CUDA), deterministic mode, the model of cli_train_cuda.sh with 6 layers (a ring
# of 3 layer inputs on the device, 3 on the host):
#  - 6 steps offloaded equal 6 steps of train.recompute=layer alone: the same metrics and
#    the same checkpoint tensor bytes (weights, m, v) at steps 3 and 6; so do 6 steps with
#    the optimizer offloaded too;
#  - resume across the modes continues bit for bit: 3 offloaded + 3 of layer alone, 3 of
#    layer + 3 offloaded, and 3 offloaded + 3 of recompute mlp equal 6 straight.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_data
need_cuda
source "$(dirname "$0")/lib_metrics.sh"
short=(--set backend=cuda --set model.hidden_size=128 --set model.num_attention_heads=2
       --set model.num_key_value_heads=1 --set model.intermediate_size=384
       --set model.num_hidden_layers=6 --set train.steps=6 --set eval.every=2
       --set train.warmup_steps=2 --set seed=99 --set train.deterministic=true
       --set train.recompute=layer --set train.checkpoint_every=3)
run_into layer
run_into offload --set train.offload_activations=true
check "6 metrics lines offloaded" "[ \$(wc -l < '$tmp/offload/metrics.jsonl') -eq 6 ]"
check "offloaded metrics equal layer's" "diff <(untimed '$tmp/layer/metrics.jsonl') <(untimed '$tmp/offload/metrics.jsonl') >&2"
check "offloaded checkpoint 3 equals layer's" "same_checkpoint '$tmp/layer/checkpoint-000003' '$tmp/offload/checkpoint-000003'"
check "offloaded checkpoint 6 equals layer's" "same_checkpoint '$tmp/layer/checkpoint-000006' '$tmp/offload/checkpoint-000006'"
run_into both --set train.offload_activations=true --set train.offload_optimizer=true
check "with the optimizer offloaded too: checkpoint 6" "same_checkpoint '$tmp/layer/checkpoint-000006' '$tmp/both/checkpoint-000006'"
# Without --config a resume takes the checkpoint's config: the key is set again each time.
run_into off_to_layer --set train.offload_activations=false --set train.resume="$tmp/offload/checkpoint-000003"
check "offloaded 3 + layer 3: metrics of steps 4-6" "diff <(sed -n '4,6p' '$tmp/layer/metrics.jsonl' | untimed) <(untimed '$tmp/off_to_layer/metrics.jsonl') >&2"
check "offloaded 3 + layer 3: checkpoint 6" "same_checkpoint '$tmp/layer/checkpoint-000006' '$tmp/off_to_layer/checkpoint-000006'"
run_into layer_to_off --set train.offload_activations=true --set train.resume="$tmp/layer/checkpoint-000003"
check "layer 3 + offloaded 3: checkpoint 6" "same_checkpoint '$tmp/layer/checkpoint-000006' '$tmp/layer_to_off/checkpoint-000006'"
run_into off_to_mlp --set train.recompute=mlp --set train.offload_activations=false --set train.resume="$tmp/offload/checkpoint-000003"
check "offloaded 3 + mlp 3: checkpoint 6" "same_checkpoint '$tmp/layer/checkpoint-000006' '$tmp/off_to_mlp/checkpoint-000006'"
finish
