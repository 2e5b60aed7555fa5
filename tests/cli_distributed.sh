#!/usr/bin/env bash
# Launching several ranks without NCCL: `train --gpus 2` starts two ranks with
# torchrun-style variables that connect over loopback TCP or through a rendezvous file
# (ONEPASS_DIST_SETUP_ONLY=1: each rank connects and exits; tests/cli_data_parallel.sh
# trains them); a failing rank stops the others and its status comes back; launcher variables that are malformed, missing or
# contradict each other are refused by name; one rank under a launcher trains as usual.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=1
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=512 --set train.micro_rows=2 --set eval.every=0
      --set data.seq_len=1024 --set backend=cpu)
launch_env=(env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR
            -u MASTER_PORT -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_LOCALID
            -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u ONEPASS_LAUNCHER)

if out=$("${launch_env[@]}" ONEPASS_DIST_SETUP_ONLY=1 "$train" --gpus 2 --set out_dir="$tmp/a" \
         "${tiny[@]}" 2>&1); then ok; else bad "--gpus 2 setup exits 0: $(tail -3 <<<"$out")"; fi
for r in 0 1; do
    grep -q "^rank $r of 2 (torchrun, local rank $r): rendezvous done" <<<"$out" && ok ||
        bad "rank $r ran its setup: $(tail -3 <<<"$out")"
done
if out=$("${launch_env[@]}" ONEPASS_DIST_SETUP_ONLY=1 "$train" --gpus 3 --set out_dir="$tmp/a" \
         --set dist.rendezvous_file="$tmp/rv" "${tiny[@]}" 2>&1) &&
   [ "$(grep -c 'rendezvous done' <<<"$out")" -eq 3 ] && [ ! -e "$tmp/rv" ]; then ok
else bad "--gpus 3 through dist.rendezvous_file: $(tail -3 <<<"$out")"; fi

start=$SECONDS
"${launch_env[@]}" ONEPASS_DIST_SETUP_ONLY=1 ONEPASS_DIST_FAIL_RANK=1 "$train" --gpus 2 \
    --set out_dir="$tmp/a" "${tiny[@]}" > "$tmp/log" 2>&1
status=$?
[ $status -eq 3 ] && ok || bad "a failed rank's status comes back: got $status"
grep -q -- "--gpus 2: rank 1 exited with status 3; stopping the other ranks" "$tmp/log" && ok ||
    bad "the failed rank is named: $(tail -3 "$tmp/log")"
[ $((SECONDS - start)) -lt 60 ] && ok || bad "rank 0 was stopped, not left waiting ($((SECONDS - start)) s)"

expect_error "--gpus needs a number" "--gpus: expected a number of processes in \[1, 64\], got 'two'" \
    "$train" --gpus two
expect_error "--gpus under a launcher" "--gpus 2: this process is rank 1 of 2 under torchrun already" \
    "${launch_env[@]}" RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 "$train" --gpus 2 "${tiny[@]}"
expect_error "malformed RANK" "environment variable RANK='x': expected an integer in \[0, 1\]" \
    "${launch_env[@]}" RANK=x WORLD_SIZE=2 LOCAL_RANK=0 "$train" --set out_dir="$tmp/b" "${tiny[@]}"
expect_error "SLURM without MASTER_ADDR" "slurm launch of 2 ranks: set MASTER_ADDR and MASTER_PORT" \
    "${launch_env[@]}" SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 "$train" --set out_dir="$tmp/b" "${tiny[@]}"
expect_error "contradicting launchers" "RANK=0 WORLD_SIZE=1 (torchrun) but OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 (mpirun)" \
    "${launch_env[@]}" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 \
    OMPI_COMM_WORLD_LOCAL_RANK=1 "$train" --set out_dir="$tmp/b" "${tiny[@]}"

# World size 1 under a launcher is the ordinary run.
if "${launch_env[@]}" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "$train" --gpus 1 --set out_dir="$tmp/one" \
       --set train.steps=1 "${tiny[@]}" > "$tmp/log" 2>&1 && [ -f "$tmp/one/checkpoint-000001/model.safetensors" ]
then ok; else bad "one rank under torchrun trains: $(tail -3 "$tmp/log")"; fi
finish
