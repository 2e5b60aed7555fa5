#!/usr/bin/env bash
# `train` through NCCL on one GPU: ONEPASS_DIST_COMM_AT_ONE=1 takes the world of
# one rank through the communicator (NCCL's id and ncclCommInitRank, the gradient
# all-reduce by the bucket plan in every step, the step's sums through NCCL), which at
# world size 1 must change nothing: the metrics but the timings, the final weights and the
# AdamW moments equal the plain run's bit for bit. Small buckets (dist.bucket_mb 1):
# several all-reduces per step. SKIP without a GPU, without CUDA or without NCCL.
source "$(dirname "$0")/lib_cli.sh" "$1"
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "SKIP: no CUDA device"; exit 77; }
gpu=(--set backend=cuda --set model.hidden_size=128 --set model.num_attention_heads=2
     --set model.num_key_value_heads=1 --set model.intermediate_size=384 --set train.steps=4
     --set eval.every=2 --set eval.max_conversations=4 --set dist.bucket_mb=1)
. "$(dirname "$0")/lib_metrics.sh"
launch_env=(env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK
            -u ONEPASS_LAUNCHER)

"${launch_env[@]}" ONEPASS_DIST_COMM_AT_ONE=1 "$train" --set out_dir="$tmp/nccl" "${gpu[@]}" \
    > "$tmp/nccl.log" 2>&1
status=$?
if grep -q 'built without CUDA\|cannot load NCCL\|built without it' "$tmp/nccl.log"; then
    echo "SKIP: $(grep -m1 'error' "$tmp/nccl.log")"; exit 77
fi
[ $status -eq 0 ] && ok || bad "the run through NCCL: $(tail -3 "$tmp/nccl.log")"
grep -q '^rank 0 of 1 (none, local rank 0): rendezvous done (NCCL), [0-9]* gradient buckets' \
    "$tmp/nccl.log" && ok || bad "the run went through NCCL: $(grep rendezvous "$tmp/nccl.log")"
"${launch_env[@]}" "$train" --set out_dir="$tmp/plain" "${gpu[@]}" > "$tmp/plain.log" 2>&1 && ok ||
    bad "the plain run: $(tail -3 "$tmp/plain.log")"
diff <(untimed "$tmp/plain/metrics.jsonl") <(untimed "$tmp/nccl/metrics.jsonl") >&2 && ok ||
    bad "metrics through NCCL equal the plain run's"
for f in model optimizer; do
    cmp <(tensor_bytes "$tmp/plain/checkpoint-000004/$f.safetensors") \
        <(tensor_bytes "$tmp/nccl/checkpoint-000004/$f.safetensors") && ok ||
        bad "$f.safetensors through NCCL equals the plain run's"
done
finish
