#!/usr/bin/env bash
# Resuming is bit-identical: a run of N steps straight vs N/2 + resume from the
# checkpoint gives the same per-step losses (every logged number except timings) and
# byte-identical final weights. Also SIGINT: the run finishes its step, checkpoints,
# exits 0; resuming in the same out_dir yields the straight run's metrics and weights.
# A resume in another train.recompute mode continues bit for bit too.
source "$(dirname "$0")/lib_cli.sh" "$1"
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=2
      --set eval.max_conversations=4 --set data.seq_len=1024 --set eval.every=2
      --set train.steps=6 --set seed=99)
export OMP_NUM_THREADS=2
# Metrics without the timing fields, which legitimately differ between runs.
. "$(dirname "$0")/lib_metrics.sh"

straight="$tmp/straight"
"$train" --set out_dir="$straight" --set train.checkpoint_every=3 "${tiny[@]}" > "$tmp/a.log" 2>&1 \
    && ok || bad "straight run: $(tail -3 "$tmp/a.log")"
resumed="$tmp/resumed"
"$train" --set out_dir="$resumed" --set train.resume="$straight/checkpoint-000003" "${tiny[@]}" \
    > "$tmp/b.log" 2>&1 && ok || bad "resumed run: $(tail -3 "$tmp/b.log")"
check "resumed run logs steps 4-6" "[ \"\$(grep -o '\"step\":[0-9]*' '$resumed/metrics.jsonl' | tr '\n' ' ')\" = '\"step\":4 \"step\":5 \"step\":6 ' ]"
check "identical metrics for steps 4-6" "diff <(sed -n '4,6p' '$straight/metrics.jsonl' | untimed) <(untimed '$resumed/metrics.jsonl') >&2"
check "identical final weights" "cmp <(tensor_bytes '$straight/checkpoint-000006/model.safetensors') <(tensor_bytes '$resumed/checkpoint-000006/model.safetensors')"
check "loss changed over the run (not a no-op)" "[ \"\$(sed -n 1p '$straight/metrics.jsonl' | grep -o '\"loss\":[^,]*')\" != \"\$(sed -n 6p '$straight/metrics.jsonl' | grep -o '\"loss\":[^,]*')\" ]"

# Resuming in another train.recompute mode (the straight run recomputes the MLP):
# the same bits, the change reported.
for mode in layer none; do
    other="$tmp/resumed_$mode"
    "$train" --set out_dir="$other" --set train.resume="$straight/checkpoint-000003" \
        --set train.recompute=$mode "${tiny[@]}" > "$tmp/$mode.log" 2>&1 \
        && ok || bad "resumed with recompute $mode: $(tail -3 "$tmp/$mode.log")"
    check "recompute $mode: the change reported" "grep -q 'changed since the checkpoint: .*train.recompute' '$tmp/$mode.log'"
    check "recompute $mode: identical metrics for steps 4-6" "diff <(sed -n '4,6p' '$straight/metrics.jsonl' | untimed) <(untimed '$other/metrics.jsonl') >&2"
    check "recompute $mode: identical final weights" "cmp <(tensor_bytes '$straight/checkpoint-000006/model.safetensors') <(tensor_bytes '$other/checkpoint-000006/model.safetensors')"
done

# SIGINT mid-run (skipped if the run finishes before the signal lands).
sig="$tmp/sig"
"$train" --set out_dir="$sig" "${tiny[@]}" > "$tmp/c.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
    [ -s "$sig/metrics.jsonl" ] && break
    sleep 0.02
done
kill -INT "$pid" 2>/dev/null
wait "$pid"; rc=$?
check "SIGINT exits 0 (rc $rc)" "[ $rc -eq 0 ]"
if grep -q 'stopped by signal after step' "$tmp/c.log"; then
    stopped=$(grep -o 'stopped by signal after step [0-9]*' "$tmp/c.log" | grep -o '[0-9]*$')
    ck="$sig/checkpoint-$(printf %06d "$stopped")"
    check "checkpoint at the stop step" "[ -s '$ck/model.safetensors' ] && [ -s '$ck/optimizer.safetensors' ]"
    "$train" --set out_dir="$sig" --set train.resume="$ck" "${tiny[@]}" > "$tmp/d.log" 2>&1 \
        && ok || bad "resume after SIGINT: $(tail -3 "$tmp/d.log")"
    check "metrics after SIGINT + resume equal the straight run's" "diff <(untimed '$straight/metrics.jsonl') <(untimed '$sig/metrics.jsonl') >&2"
    check "weights after SIGINT + resume equal the straight run's" "cmp <(tensor_bytes '$straight/checkpoint-000006/model.safetensors') <(tensor_bytes '$sig/checkpoint-000006/model.safetensors')"
else
    echo "note: the run finished before SIGINT arrived; interrupt checks skipped"
fi

finish
