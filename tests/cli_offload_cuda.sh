#!/usr/bin/env bash
# `train` with train.offload_optimizer on the GPU (exit 77 "SKIP: no CUDA device" without a
# GPU or CUDA), deterministic mode, the model of cli_train_cuda.sh:
#  - 6 steps offloaded equal 6 steps with the optimizer on the device: the same metrics
#    and the same checkpoint tensor bytes (weights, m, v) at steps 3 and 6;
#  - resume bit for bit in both modes and across them: 3 offloaded + 3 offloaded, and
#    3 offloaded + 3 on the device, equal 6 straight;
#  - the console's GPU memory is lower offloaded.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_cuda
short=(--set backend=cuda --set model.hidden_size=128 --set model.num_attention_heads=2
       --set model.num_key_value_heads=1 --set model.intermediate_size=384 --set train.steps=6
       --set eval.every=2 --set train.warmup_steps=2 --set seed=99 --set train.deterministic=true)
source "$(dirname "$0")/lib_metrics.sh"
run_into device --set train.checkpoint_every=3
run_into offload --set train.checkpoint_every=3 --set train.offload_optimizer=true
check "offloaded metrics equal the device optimizer's" "diff <(untimed '$tmp/device/metrics.jsonl') <(untimed '$tmp/offload/metrics.jsonl') >&2"
check "offloaded checkpoint 3 equals the device one" "same_checkpoint '$tmp/device/checkpoint-000003' '$tmp/offload/checkpoint-000003'"
check "offloaded checkpoint 6 equals the device one" "same_checkpoint '$tmp/device/checkpoint-000006' '$tmp/offload/checkpoint-000006'"
mem() { grep -o 'GPU mem [0-9.]*' "$1" | tail -1 | awk '{print $3}'; }
check "GPU memory lower offloaded ($(mem "$tmp/offload.log") vs $(mem "$tmp/device.log") GiB)" \
    "awk -v a=$(mem "$tmp/offload.log") -v b=$(mem "$tmp/device.log") 'BEGIN{exit !(a < b)}'"
run_into resumed --set train.offload_optimizer=true --set train.resume="$tmp/offload/checkpoint-000003"
check "offloaded resume: metrics of steps 4-6" "diff <(sed -n '4,6p' '$tmp/offload/metrics.jsonl' | untimed) <(untimed '$tmp/resumed/metrics.jsonl') >&2"
check "offloaded resume: checkpoint 6" "same_checkpoint '$tmp/offload/checkpoint-000006' '$tmp/resumed/checkpoint-000006'"
run_into switched --set train.offload_optimizer=false --set train.resume="$tmp/offload/checkpoint-000003"
check "an offloaded checkpoint resumed on the device: checkpoint 6" "same_checkpoint '$tmp/offload/checkpoint-000006' '$tmp/switched/checkpoint-000006'"
finish
