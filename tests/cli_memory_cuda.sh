#!/usr/bin/env bash
# The CUDA backend refuses a micro-batch too large for the GPU before allocating,
# naming the estimate, the free memory, the keys and a setting that fits, instead of a CUDA
# "out of memory", and before out_dir is made. Exit 77 without a GPU or a CUDA build.
source "$(dirname "$0")/lib_cli.sh"
need_data
need_cuda
gpu=(--set backend=cuda --set model.hidden_size=128 --set model.num_attention_heads=2
     --set model.num_key_value_heads=1 --set model.intermediate_size=384 --set train.steps=1)
expect_error "micro_rows 65536" "config keys train.micro_rows x data.seq_len, train.recompute and model.\*: the CUDA backend needs about .* GiB of device memory, .* GiB are free" \
    "$train" "${gpu[@]}" --set out_dir="$tmp/a" --set train.micro_rows=65536
expect_error "names the micro-batch" "65536 x 1024 tokens per micro-batch (train.micro_rows x data.seq_len) with train.recompute=mlp.*it fits with .*train.micro_rows=[0-9]" \
    "$train" "${gpu[@]}" --set out_dir="$tmp/a" --set train.micro_rows=65536
[ ! -e "$tmp/a" ] && ok || bad "a refused run leaves no out_dir"
expect_error "2^31 tokens" "65536 x 65536 = 4294967296 tokens per micro-batch, more than the CUDA kernels index" \
    "$train" "${gpu[@]}" --set out_dir="$tmp/b" --set train.micro_rows=65536 --set data.seq_len=65536
finish
