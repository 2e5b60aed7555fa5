#!/usr/bin/env bash
# Data parallel on the CPU backend: `train --gpus 2 --set backend=cpu` trains
# through the TCP communicator. Each step has its rows split over the ranks, one
# micro-batch (one row) per rank where the step has two rows, against one rank of
# twice the micro-batches: every logged number but the timings (loss, grad norm, counts,
# the eval losses of rank 0's eval) and the final weights and AdamW moments are bit for
# bit the one-rank run's (the gradients are summed in rank order, and each micro-batch's
# are computed from zero, so the one rank adds them in the same order; one OpenMP thread
# everywhere: the CPU kernels' sums depend on the thread count). A 2-rank checkpoint resumed on 1 rank and a
# 1-rank one resumed on 2 continue the uninterrupted run bit for bit. Rank 1 writes
# nothing (started by hand with torchrun's variables and its own out_dir, which must not
# appear); the log line says the world size. A SIGTERM to `train --gpus 2` stops both
# ranks after one step (the ranks agree on it), rank 0 checkpoints, exit 0.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=1
# data.unpacked: one conversation per row; 512 trained tokens per step of the 200
# conversations of eval.jsonl (fast to load): with seed 13 the steps have 2 2 1 2 2 2
# rows (checked below: a 3-row step splits 1 + 2, and the 2 rows' gradients are then
# added before, not after, the first row's; a 1-row step leaves rank 1 without rows).
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=512 --set train.micro_rows=1 --set eval.every=3
      --set eval.max_conversations=2
      --set data.seq_len=1024 --set data.unpacked=true --set backend=cpu --set train.steps=6
      --set train.warmup_steps=1 --set train.checkpoint_every=3 --set seed=13
      --set data.train_path=datasets/synthetic/eval.jsonl)
launch_env=(env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR
            -u MASTER_PORT -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_LOCALID
            -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u ONEPASS_LAUNCHER)
# Metrics without the timing fields and the world size.
. "$(dirname "$0")/lib_metrics.sh"
untimed_ranks() { untimed "$@" | sed -E 's/,"world_size":[0-9]*//'; }
# same_run <what> <dir a> <dir b>: b's metrics lines are a's last ones; the final states.
same_run() {
    if diff <(tail -n "$(wc -l < "$3/metrics.jsonl")" "$2/metrics.jsonl" | untimed_ranks) \
            <(untimed_ranks "$3/metrics.jsonl") >&2
    then ok; else bad "$1: the metrics differ"; fi
    for f in model optimizer; do
        cmp <(tensor_bytes "$2/checkpoint-000006/$f.safetensors") \
            <(tensor_bytes "$3/checkpoint-000006/$f.safetensors") && ok || bad "$1: $f.safetensors differs"
    done
}
run() {  # run <log> <train args...>
    local log="$1"; shift
    "${launch_env[@]}" "$train" "$@" "${tiny[@]}" > "$log" 2>&1 || bad "$* failed: $(tail -3 "$log")"
}

run "$tmp/one.log" --set out_dir="$tmp/one"
run "$tmp/two.log" --gpus 2 --set out_dir="$tmp/two"
same_run "2 ranks vs 1 rank" "$tmp/one" "$tmp/two"
# The comparison means something: rank 1 had rows, and the run learnt.
rows=$(grep -o '"conversations":[0-9]*' "$tmp/one/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
[ "$rows" = "2 2 1 2 2 2 " ] && ok || bad "the steps' rows (one per conversation): $rows"
[ "$(sed -n 1p "$tmp/one/metrics.jsonl" | grep -o '"loss":[^,]*')" != \
  "$(sed -n 6p "$tmp/one/metrics.jsonl" | grep -o '"loss":[^,]*')" ] && ok || bad "the loss moved"
[ "$(grep -c '"eval_loss"' "$tmp/two/metrics.jsonl")" -eq 2 ] && ok || bad "rank 0 evaluated at steps 3, 6"
grep -q '"world_size":2' "$tmp/two/metrics.jsonl" && ! grep -q world_size "$tmp/one/metrics.jsonl" &&
    ok || bad "metrics.jsonl says world_size 2 only with 2 ranks"
[ "$(grep -c '^step [0-9]/6 .* | 2 ranks\( |\|$\)' "$tmp/two.log")" -eq 6 ] && ok ||
    bad "one step line per step, saying 2 ranks: $(grep '^step' "$tmp/two.log" | head -2)"

# Resume across world sizes: 2 ranks' step 3 on 1 rank, 1 rank's step 3 on 2 ranks.
run "$tmp/r21.log" --set out_dir="$tmp/r21" --set train.resume="$tmp/two/checkpoint-000003"
same_run "2-rank checkpoint resumed on 1 rank" "$tmp/one" "$tmp/r21"
run "$tmp/r12.log" --gpus 2 --set out_dir="$tmp/r12" --set train.resume="$tmp/one/checkpoint-000003"
same_run "1-rank checkpoint resumed on 2 ranks" "$tmp/one" "$tmp/r12"
[ "$(wc -l < "$tmp/r12/metrics.jsonl")" -eq 3 ] && ok || bad "the resumed runs log steps 4-6"

# Two processes with torchrun's variables, rank 1 told another out_dir: it stays unmade.
port=$(( 20000 + RANDOM % 20000 ))
pids=()
for r in 1 0; do
    "${launch_env[@]}" RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$train" --set out_dir="$tmp/rank$r" "${tiny[@]}" --set train.steps=2 > "$tmp/rank$r.log" 2>&1 &
    pids+=($!)
done
wait "${pids[0]}" && wait "${pids[1]}" && ok ||
    bad "torchrun-style ranks: $(tail -3 "$tmp/rank0.log" "$tmp/rank1.log")"
[ -f "$tmp/rank0/checkpoint-000002/model.safetensors" ] && [ -f "$tmp/rank0/metrics.jsonl" ] && ok ||
    bad "rank 0 wrote its out_dir: $(ls "$tmp/rank0" 2>&1)"
[ ! -e "$tmp/rank1" ] && ok || bad "rank 1 wrote nothing: $(ls -R "$tmp/rank1")"
! grep -q '^step \|^checkpoint' "$tmp/rank1.log" && ok || bad "rank 1 logs no step"

"${launch_env[@]}" "$train" --gpus 2 --set out_dir="$tmp/sig" "${tiny[@]}" --set train.steps=100000 \
    > "$tmp/sig.log" 2>&1 &
pid=$!
for _ in $(seq 1 500); do [ -s "$tmp/sig/metrics.jsonl" ] && break; sleep 0.02; done
kill -TERM "$pid"
wait "$pid" && ok || bad "SIGTERM: exit 0: $(tail -3 "$tmp/sig.log")"
step=$(sed -n 's/^stopped by signal after step \([0-9]*\);.*/\1/p' "$tmp/sig.log")
[ -n "$step" ] && [ -f "$tmp/sig/checkpoint-$(printf %06d "$step")/model.safetensors" ] && ok ||
    bad "SIGTERM: a checkpoint at the step both ranks stopped after: $(tail -3 "$tmp/sig.log")"
finish
