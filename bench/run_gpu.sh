#!/usr/bin/env bash
# The GPU machine's runner: the CUDA build's checks and benchmarks, one mode per device call.
#   bench/run_gpu.sh MODE BIN_DIR OUT_DIR     MODE: tests|attention|trainer|lora|decode|hf|curves|walltime|all
#   bench/run_gpu.sh ab DIR_A DIR_B OUT_DIR   A/B of two bundles: attention check and timing
#   bench/run_gpu.sh targets MODE             the binaries MODE needs (for bench/device_bundle.sh)
# Runs from the repository root (configs/, datasets/, tests/cli_*_cuda.sh, bench/anchors/).
# BIN_DIR holds bundle.tar.gz of bench/device_bundle.sh (the binaries and the shared libraries
# the GPU machine lacks; unpacked there first), or the binaries themselves (a build folder on a
# machine that has the libraries).
#
# Device-call recipe (the GPU machine: Ubuntu 24.04, CUDA 13.0, one H100 or H200, PyTorch
# with transformers, no SentencePiece, no internet; the command runs in a copy of the
# repository root and $OUT is the folder that comes back):
#   here:   cmake -S . -B build-cuda -DONEPASS_CUDA=ON && cmake --build build-cuda -j2
#           bench/device_bundle.sh build-cuda .device/MODE $(bench/run_gpu.sh targets MODE)
#           bench/run_gpu.sh MODE .device/MODE /tmp/out   (here: checks the bundle, then SKIP)
#   call:   command  bash bench/run_gpu.sh MODE .device/MODE "$OUT"
#           carry    [".device/MODE"]
#   back:   OUT/summary.txt (also the call's output) and OUT/logs.tar.gz (every log, packed
#           after each step, so a call stopped at its time limit still returns what ran).
# A carry holds at most 64 MiB with the working tree (device_bundle.sh prints the bundle's
# size; every mode's binaries together fit) and a call runs at most 10 minutes: one mode per
# call; `all` runs longer than that.
#
# Modes:
#   tests      every test_*_cuda binary (300 s each: a hang costs one test), test_offload_cuda
#              under compute-sanitizer memcheck, and the GPU CLI
#              checks tests/cli_*_cuda.sh against BIN_DIR/train; NCCL from PyTorch's copy
#              unless ONEPASS_NCCL_LIBRARY names one.
#   attention  test_attention_cuda beside compute-sanitizer memcheck and racecheck of its
#              quick cases (ATTN_TEST_QUICK=1), then bench_attention (H=16 D=128 at
#              ATTN_SIZES, default "4096 16384"; H=12 KV=4 D=64 and H=32 KV=8 D=128 at 8192)
#              and the anchors on the same shapes in the same call: bench/anchors/attention.py
#              (FlexAttention's Triton backend, SDPA with the dense mask, SDPA causal) and,
#              where FlashAttention-4 is installed (below), FlexAttention's FA4 backend.
#              PROFILE=1 adds Nsight Compute on one launch of each main kernel (S=16384, causal).
#   trainer    bench_trainer on configs/bench_<C>.json for C in CONFIGS (default: small
#              tinyllama qwen3_0.6b qwen2.5_1.5b) beside bench/anchors/trainer.py on the same
#              model and row length (S overrides data.seq_len for both), then a table of step
#              time, tokens/s, MFU and peak GPU memory. STAGES=1 adds a run with per-stage
#              CUDA-event times (ONEPASS_STAGE_TIMES=1), DET=1 one with the deterministic
#              attention backward, BACKEND=FLASH gives the anchor FlexAttention's FA4 backend.
#              RECOMPUTE="mlp layer" adds a run per train.recompute mode (each beside the
#              config's own), STEPS the timed steps of both (defaults: bench_trainer's,
#              the anchor's 20). OFFLOAD=1 adds beside each onepass run its twin with
#              train.offload_optimizer=true. CKPT=1 gives the anchor per-block activation
#              checkpointing (the PyTorch counterpart of train.recompute=layer).
#   lora       LoRA beside full fine-tuning and PEFT + transformers, for each NAME:S in CONFIGS
#              (default "qwen3_4b:4096 qwen3_8b:32768"; NAME alone: the config's data.seq_len;
#              S, where set, replaces every S):
#              bench_trainer on configs/bench_NAME.json at data.seq_len S with full fine-tuning
#              (FULL=0 leaves it out; where it does not fit, bench_trainer refuses up front and
#              the table says so), then with --set lora.r=LORA_R (default 16; lora.targets
#              empty: all seven projections), both with train.recompute=RECOMPUTE (default:
#              layer where S > 8192, else the config's own), then bench/anchors/peft_trainer.py
#              on the same model and row for each of PEFT_RUNS (default "sdpa flex_strip": SDPA
#              with a causal mask, FlexAttention with the strip-thinking BlockMask; "flex":
#              FlexAttention causal), gradient checkpointing on where RECOMPUTE is layer
#              (PEFT_CKPT=0|1 overrides), PEFT_STEPS timed steps (default 10), COMPILE=1 for
#              torch.compile. Then a table of step time, tokens/s, MFU and peak GPU memory,
#              and the ratios onepass LoRA / onepass full and onepass LoRA / the fastest PEFT
#              run. A run out of GPU memory is a row saying so, not a failure. PEFT and
#              accelerate come from the wheels of bench/anchors/peft_wheels.sh where the
#              machine lacks them: here `bash bench/anchors/peft_wheels.sh .peft` (about
#              1.4 MB, git-ignored), then carry [".device/lora", ".peft"]. One config a call
#              where the rows are long: CONFIGS=qwen3_4b:4096 in one call, CONFIGS=qwen3_8b:32768
#              FULL=0 STEPS=10 in the next, on the H200 (a call runs at most 10 minutes; the
#              anchor's fp32 logits, 19.9 GB a copy at S=32768, may not fit an 80 GB card).
#   decode     test_decode_cuda beside the same under compute-sanitizer memcheck, then
#              bench_decode (DECODE_ARGS: its arguments, e.g. "tinyllama 64 512 128").
#   hf         test_ops_cuda, test_model_cuda, test_hf_model_cuda, then the Hugging Face round
#              trip: fixtures of the CUDA shapes made there by transformers
#              (scripts/fixtures/make_hf_fixtures.py --cuda-shapes), each trained one step at
#              lr 0 on the GPU, exported and loaded back by transformers, whose loss must match
#              onepass's eval loss (scripts/repro/hf_roundtrip.sh, bench/anchors/hf_compare.py).
#   curves     the three layouts' runs of scripts/repro/loss_curves.sh on the GPU (the GPU
#              machine has no gnuplot); plot here afterwards: tar xzf logs.tar.gz -C DIR;
#              scripts/repro/loss_curves.sh --runs DIR/curves/runs --plot-only
#              --png docs/loss_curves_gpu.png --md DIR/curves.md (then into docs/RESULTS.md)
#   walltime   scripts/repro/layout_walltime.sh: npass, duplicate, mask_only, as_rendered and
#              preserve on the same generated conversations (WALLTIME_PROFILE, default chat)
#              at data.seq_len 32768 from config.json-only folders of WALLTIME_MODELS
#              (default configs/hf/qwen3-0.6b; one model a call: WALLTIME_MODELS=
#              configs/hf/qwen3-1.7b in the next), one table each: tokens, wall time,
#              tokens/s, npass-equivalent tokens/s, GPU memory, ratios to npass.
#   all        tests, attention, trainer, decode and hf in turn.
#   ab         test_attention_cuda of both bundles and racecheck (quick cases) of B, in
#              parallel, then bench_attention and, where both bundles hold it, bench_trainer
#              (bench_small, bench_tinyllama) of A, B, A, B: drift and noise show as the spread
#              within a side. The libraries come from DIR_B, so DIR_A may hold the binaries
#              alone: bench/device_bundle.sh build-a .device/ab/a $(bench/run_gpu.sh targets ab),
#              the same for b; carry [".device/ab"].
# ANCHOR=0 leaves out the anchors (attention, trainer). Exit status: 0 when every step
# passed or skipped, 1 when one failed, 2 on a usage or bundle error, 77 (SKIP) without a GPU.
#
# FlashAttention-4 (the attention mode's FA4 anchor; BACKEND=FLASH of bench/anchors/trainer.py):
# PyTorch on the GPU machine lacks it, and its wheels (one ~92 MB) exceed a carry, so they
# come from the package registry here and travel in two calls of their own, right before
# the benchmark call on the same warm machine (it is given back ~30 s after a call; if it
# was, start again at call 1):
#   here, once:  bash <the shared anchors folder>/fa4_wheels.sh .fa4   (.fa4/ is git-ignored)
#   call 1, carry [".fa4/a"]:  mkdir -p /root/fa4 && cp .fa4/a/part_aa /root/fa4/
#   call 2, carry [".fa4/b"]:  bash .fa4/b/fa4_install.sh      (installs into /tmp/fa4site)
#   call 3: the attention mode as above; it finds /tmp/fa4site.
set -u
FA4_SITE=/tmp/fa4site
PEFT_SITE=/tmp/peftsite

usage() {
    { echo usage:; sed -n '3,5s/^#//p' "$0"; } >&2
    exit 2
}

# targets MODE: the binaries MODE runs, one line.
targets() {
    case "$1" in
        tests) echo "$(for t in tests/test_*.cu; do basename "$t" .cu; done | tr '\n' ' ')train" ;;
        attention) echo "test_attention_cuda bench_attention" ;;
        trainer) echo "bench_trainer" ;;
        lora) echo "bench_trainer" ;;
        decode) echo "test_decode_cuda bench_decode" ;;
        hf) echo "test_ops_cuda test_model_cuda test_hf_model_cuda train" ;;
        curves) echo "train" ;;
        walltime) echo "train" ;;
        all) for m in tests attention trainer decode hf; do targets "$m"; done | tr ' ' '\n' | sort -u | paste -sd ' ' ;;
        ab) echo "test_attention_cuda bench_attention bench_trainer" ;;
        *) return 1 ;;
    esac
}

# contents DIR: the files DIR offers, one a line: its bundle.tar.gz's, else its own.
contents() {
    if [ -f "$1/bundle.tar.gz" ]; then
        tar -tzf "$1/bundle.tar.gz" | sed 's|^\./||'
    else
        ls "$1"
    fi
}

# need DIR MODE [OPTIONAL...]: every binary of MODE in DIR but the optional ones, or exit 2.
need() {
    local dir=$1 mode=$2 missing=() b o optional have
    shift 2
    have=$(contents "$dir") || exit 2
    for b in $(targets "$mode"); do
        optional=0
        for o in "$@"; do [ "$b" = "$o" ] && optional=1; done
        [ $optional = 1 ] || grep -qx "$b" <<< "$have" || missing+=("$b")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "run_gpu.sh: $dir lacks ${missing[*]}; bundle them here first:" >&2
        echo "  bench/device_bundle.sh BUILD_DIR $dir $(targets "$mode")" >&2
        exit 2
    fi
}

report() { echo "$*" | tee -a "$out/summary.txt"; }

# show LOG [PATTERN]: the log's lines (those matching PATTERN) into the summary.
show() { grep -E "${2:-.}" "$1" | tee -a "$out/summary.txt"; }

# step NAME LIMIT_S COMMAND...: COMMAND with its output in $logs/NAME.log and at most LIMIT_S
# seconds, then one line: NAME, its exit status (124: stopped at the limit; 77: SKIP), its
# seconds and the log's last line, then the log's first FAIL and SKIP lines.
step() {
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    timeout "$limit" "$@" > "$logs/$name.log" 2>&1
    rc=$?
    report "$name rc=$rc ($((SECONDS - start)) s) $(tail -n 1 "$logs/$name.log")"
    grep -E 'FAIL|SKIP' "$logs/$name.log" | head -n 5 | sed 's/^/    /' | tee -a "$out/summary.txt"
    [ $rc = 0 ] || [ $rc = 77 ] || echo "$name" >> "$work/failed"
    return $rc
}

# unpack DIR NAME: the folder of DIR's binaries: DIR, or its bundle unpacked into $scratch/NAME.
unpack() {
    if [ -f "$1/bundle.tar.gz" ]; then
        mkdir -p "$scratch/$2" && tar -C "$scratch/$2" -xzf "$1/bundle.tar.gz" || exit 2
        echo "$scratch/$2"
    else
        echo "$1"
    fi
}

# Packs every log into OUT/logs.tar.gz (weights left out).
pack() {
    tar -C "$work" --exclude='*.safetensors' --exclude='checkpoint-*' -czf "$out/logs.tar.gz.part" . &&
        mv "$out/logs.tar.gz.part" "$out/logs.tar.gz"
}

# begin NAME: a log folder for one mode.
begin() {
    logs=$work/$1
    mkdir -p "$logs"
    report "== $1"
}

mode_tests() {
    begin tests
    local path t script
    for path in "$bin"/test_*_cuda; do
        t=$(basename "$path")
        step "$t" 300 "$path"
        pack
    done
    # The offloaded optimizer's host thread and copies under memcheck (its device-memory
    # comparison left out: the sanitizer pads allocations).
    step memcheck_offload 300 env TEST_UNDER_SANITIZER=1 compute-sanitizer --error-exitcode 1 \
        --tool memcheck "$bin/test_offload_cuda"
    pack
    for script in tests/cli_*_cuda.sh; do
        t=$(basename "$script" .sh)
        step "$t" 300 bash "$script" "$bin/train"
        pack
    done
}

# attention_shapes: "H KV D S..." lines, bench_attention's default runs.
attention_shapes() {
    echo "16 16 128 ${ATTN_SIZES:-4096 16384}"
    echo "12 4 64 8192"
    echo "32 8 128 8192"
}

mode_attention() {
    begin attention
    local h kv d lens spec metrics
    step test_attention_cuda 300 "$bin/test_attention_cuda" &
    step memcheck 300 env ATTN_TEST_QUICK=1 compute-sanitizer --error-exitcode 1 --tool memcheck --leak-check full \
        "$bin/test_attention_cuda" &
    step racecheck 300 env ATTN_TEST_QUICK=1 compute-sanitizer --error-exitcode 1 --tool racecheck \
        --racecheck-report all "$bin/test_attention_cuda" &
    wait
    pack
    # shellcheck disable=SC2086  # ATTN_SIZES: lengths, one argument each
    step bench_attention 300 "$bin/bench_attention" ${ATTN_SIZES:-}
    show "$logs/bench_attention.log" '^ *[0-9]|^ +S |^device'
    pack
    if [ "${ANCHOR:-1}" = 1 ]; then
        while read -r h kv d lens; do
            # shellcheck disable=SC2086
            step "anchor_H${h}_KV${kv}_D$d" 400 env H="$h" KV="$kv" D="$d" PYTHONUNBUFFERED=1 \
                python3 bench/anchors/attention.py $lens
            show "$logs/anchor_H${h}_KV${kv}_D$d.log" '^\{'
            pack
        done < <(attention_shapes)
        if [ -f "$FA4_SITE/.ok" ]; then
            while read -r h kv d lens; do
                # shellcheck disable=SC2086
                step "fa4_H${h}_KV${kv}_D$d" 400 env H="$h" KV="$kv" D="$d" METHODS=fa4 PYTHONUNBUFFERED=1 \
                    PYTHONPATH="$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages" python3 bench/anchors/attention.py $lens
                show "$logs/fa4_H${h}_KV${kv}_D$d.log" '^\{'
                pack
            done < <(attention_shapes)
        else
            report "SKIP the FA4 anchor: FlashAttention-4 is not installed on this machine (bench/run_gpu.sh, \"FlashAttention-4\")"
        fi
    fi
    if [ "${PROFILE:-0}" = 1 ]; then
        # One launch of each main kernel at S=16384, causal: time, tensor and shared-memory
        # pipe use, occupancy, stall reasons.
        metrics=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
        metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
        metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum
        for spec in attn_fwd_kernel attn_bwd_dkdv_kernel attn_bwd_dq_kernel; do
            step "ncu_$spec" 200 ncu --clock-control none -k "regex:$spec" --launch-count 1 --section SpeedOfLight \
                --section Occupancy --section WarpStateStats --metrics "$metrics" "$bin/bench_attention" 16384 causal
            show "$logs/ncu_$spec.log" 'Duration|Compute \(SM\) Throughput|Memory Throughput|hmma|mem_shared|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued'
            pack
        done
    fi
}

# tag IMPL CONFIG < JSON lines: the last one with impl and config in front, into results.jsonl.
tag() { grep '^{' | tail -n 1 | sed "s/^{/{\"impl\": \"$1\", \"bench\": \"$2\", /" >> "$logs/results.jsonl"; }

mode_trainer() {
    begin trainer
    local c cfg args python=(env PYTHONUNBUFFERED=1)
    [ "${BACKEND:-}" = FLASH ] && python+=(PYTHONPATH="$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages")
    for c in ${CONFIGS:-small tinyllama qwen3_0.6b qwen2.5_1.5b}; do
        cfg=configs/bench_$c.json
        args=(--config "$cfg")
        [ -n "${S:-}" ] && args+=(--set data.seq_len="$S")
        local offload=(false); [ "${OFFLOAD:-0}" = 1 ] && offload+=(true)
        for o in "${offload[@]}"; do
            local sfx=""; [ "$o" = true ] && sfx=_offload
            step "onepass_$c$sfx" 300 "$bin/bench_trainer" "${args[@]}" --set train.offload_optimizer="$o" ${STEPS:+"$STEPS"} &&
                tag "onepass$sfx" "$c" < "$logs/onepass_$c$sfx.log"
            for r in ${RECOMPUTE:-}; do
                step "onepass_${c}_$r$sfx" 300 "$bin/bench_trainer" "${args[@]}" --set train.offload_optimizer="$o" --set train.recompute="$r" ${STEPS:+"$STEPS"} &&
                    tag "onepass_$r$sfx" "$c" < "$logs/onepass_${c}_$r$sfx.log"
            done
        done
        if [ "${STAGES:-0}" = 1 ]; then
            step "onepass_${c}_stages" 300 env ONEPASS_STAGE_TIMES=1 "$bin/bench_trainer" "${args[@]}" 6
            show "$logs/onepass_${c}_stages.log" '^\{'
        fi
        if [ "${DET:-0}" = 1 ]; then
            step "onepass_${c}_det" 300 "$bin/bench_trainer" "${args[@]}" --set train.deterministic=true &&
                tag onepass_det "$c" < "$logs/onepass_${c}_det.log"
        fi
        if [ "${ANCHOR:-1}" = 1 ]; then
            step "anchor_$c" 400 "${python[@]}" python3 bench/anchors/trainer.py "$cfg" ${S:+"$S"} &&
                tag anchor "$c" < "$logs/anchor_$c.log"
        fi
        pack
    done
    [ -s "$logs/results.jsonl" ] || return 0
    python3 - "$logs/results.jsonl" <<'PY' | tee -a "$out/summary.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(f"{'bench':14} {'impl':15} {'params_M':>8} {'S':>6} {'step_ms':>8} {'tokens/s':>9} {'MFU':>6} {'peak GiB':>8}")
for r in rows:
    mfu = next(v for k, v in r.items() if k.startswith("mfu_vs_"))
    print(f"{r['bench']:14} {r['impl']:15} {r['params_M']:8.1f} {r['S']:6d} {r['step_ms']:8.2f} "
          f"{r['tokens_per_s']:9.0f} {mfu:6.3f} {r['mem_GiB']:8.2f}")
PY
}

# outcome NAME IMPL BENCH S: NAME's result into results.jsonl: its JSON line, or a row saying
# that it did not fit (bench_trainer's refusal up front) or ran out of GPU memory (PyTorch),
# which is a result, not a failure.
outcome() {
    local log=$logs/$1.log status
    if grep -q '^{' "$log"; then
        tag "$2" "$3" < "$log"
        return
    fi
    if grep -qE 'GiB of device memory, [0-9.]+ GiB are free' "$log"; then
        status="does not fit"
    elif grep -qE 'OutOfMemoryError|CUDA out of memory' "$log"; then
        status="out of memory"
    else
        return
    fi
    echo "{\"impl\": \"$2\", \"bench\": \"$3\", \"S\": $4, \"status\": \"$status\"}" >> "$logs/results.jsonl"
    [ -f "$work/failed" ] && sed -i "/^$1\$/d" "$work/failed"
    report "    $1: $status (a result, not a failure)"
}

# peft_ready: 0 when python3 imports peft, after installing into $PEFT_SITE the wheels of
# bench/anchors/peft_wheels.sh (PEFT_WHEELS, default .peft) the machine lacks.
peft_ready() {
    local wheels=${PEFT_WHEELS:-.peft} m w=()
    export PYTHONPATH=$PEFT_SITE${PYTHONPATH:+:$PYTHONPATH}
    python3 -c 'import peft' 2>/dev/null && return 0
    for m in psutil accelerate peft; do
        python3 -c "import $m" 2>/dev/null && continue
        w=("$wheels/$m"-*.whl)
        [ -f "${w[0]}" ] || return 1
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$PEFT_SITE" "${w[0]}" ||
            return 1
    done
    python3 -c 'import peft'
}

mode_lora() {
    begin lora
    local entry c s cfg rc ckpt run attn strip name peft=1 base=()
    if peft_ready; then
        python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'peft', peft.__version__)" 2>&1 | tee -a "$out/summary.txt"
    else
        peft=0
        report "SKIP the PEFT anchor: peft is not installed here and no wheels came in ${PEFT_WHEELS:-.peft} (bench/run_gpu.sh, \"lora\")"
    fi
    for entry in ${CONFIGS:-qwen3_4b:4096 qwen3_8b:32768}; do
        c=${entry%%:*}
        cfg=configs/bench_$c.json
        s=${S:-${entry#*:}}
        if [ "$s" = "$entry" ]; then  # NAME alone: the config's data.seq_len
            s=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["data"]["seq_len"])' "$cfg") || {
                report "run_gpu.sh: CONFIGS: $cfg has no data.seq_len; write $c:S"; echo "lora_$c" >> "$work/failed"; continue; }
        fi
        rc=${RECOMPUTE:-}
        [ -z "$rc" ] && [ "$s" -gt 8192 ] && rc=layer
        base=(--config "$cfg" --set data.seq_len="$s")
        [ -n "$rc" ] && base+=(--set train.recompute="$rc")
        if [ "${FULL:-1}" = 1 ]; then
            step "onepass_full_${c}_$s" 300 "$bin/bench_trainer" "${base[@]}" ${STEPS:+"$STEPS"}
            outcome "onepass_full_${c}_$s" onepass_full "$c" "$s"
            pack
        fi
        step "onepass_lora_${c}_$s" 300 "$bin/bench_trainer" "${base[@]}" --set lora.r="${LORA_R:-16}" ${STEPS:+"$STEPS"}
        outcome "onepass_lora_${c}_$s" onepass_lora "$c" "$s"
        pack
        if [ $peft = 0 ] || [ "${ANCHOR:-1}" != 1 ]; then continue; fi
        ckpt=${PEFT_CKPT:-0}
        if [ -z "${PEFT_CKPT:-}" ] && [ "$rc" = layer ]; then ckpt=1; fi
        for run in ${PEFT_RUNS:-sdpa flex_strip}; do
            case "$run" in
                sdpa) attn=sdpa strip=0 ;;
                flex) attn=flex strip=0 ;;
                flex_strip) attn=flex strip=1 ;;
                *) report "run_gpu.sh: PEFT_RUNS: unknown run '$run' (sdpa, flex, flex_strip)"; echo "peft_$run" >> "$work/failed"; continue ;;
            esac
            name=peft_${run}_${c}_$s
            step "$name" 400 env PYTHONUNBUFFERED=1 ATTN=$attn STRIP=$strip CKPT="$ckpt" COMPILE="${COMPILE:-0}" \
                python3 bench/anchors/peft_trainer.py "$cfg" "$s" --r "${LORA_R:-16}" --steps "${PEFT_STEPS:-10}"
            outcome "$name" "peft_$run" "$c" "$s"
            pack
        done
    done
    [ -s "$logs/results.jsonl" ] || return 0
    python3 - "$logs/results.jsonl" <<'PY' | tee -a "$out/summary.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(f"{'bench':10} {'impl':16} {'params_M':>8} {'S':>6} {'recompute':>9} {'step_ms':>9} {'tokens/s':>9} {'MFU':>6} {'peak GiB':>8}")
for r in rows:
    if "status" in r:
        print(f"{r['bench']:10} {r['impl']:16} {'':8} {r['S']:6d} {r['status']}")
        continue
    mfu = next(v for k, v in r.items() if k.startswith("mfu_vs_"))
    rec = r.get("recompute") or ("ckpt" if r.get("ckpt") else "none")
    print(f"{r['bench']:10} {r['impl']:16} {r['params_M']:8.1f} {r['S']:6d} {rec:>9} {r['step_ms']:9.2f} {r['tokens_per_s']:9.0f} "
          f"{mfu:6.3f} {r['mem_GiB'] if r['mem_GiB'] is not None else float('nan'):8.2f}")
print("ratios of tokens/s (goals: LoRA / full >= 1.3 where full runs; onepass LoRA / PEFT >= 1.5):")
for bench, S in dict.fromkeys((r["bench"], r["S"]) for r in rows):
    got = {r["impl"]: r for r in rows if (r["bench"], r["S"]) == (bench, S) and "status" not in r}
    lora, full = got.get("onepass_lora"), got.get("onepass_full")
    peft = [r for k, r in got.items() if k.startswith("peft_")]
    line = f"  {bench} S={S}:"
    if lora and full:
        line += f" onepass LoRA / full {lora['tokens_per_s'] / full['tokens_per_s']:.2f}"
    if lora and peft:
        best = max(peft, key=lambda r: r["tokens_per_s"])
        line += f"; onepass LoRA / PEFT ({best['impl']}) {lora['tokens_per_s'] / best['tokens_per_s']:.2f}"
    if not lora or not peft:
        line += f" (no ratio without {'onepass LoRA' if not lora else 'a PEFT run'})"
    print(line)
PY
}

mode_decode() {
    begin decode
    step test_decode_cuda 300 "$bin/test_decode_cuda" &
    step decode_memcheck 400 compute-sanitizer --error-exitcode 1 --tool memcheck --leak-check full \
        "$bin/test_decode_cuda" &
    wait
    pack
    # shellcheck disable=SC2086  # DECODE_ARGS: bench_decode's arguments
    step bench_decode 300 "$bin/bench_decode" ${DECODE_ARGS:-}
    show "$logs/bench_decode.log" '^\{'
    pack
}

mode_hf() {
    begin hf
    local t
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
        2>&1 | tee -a "$out/summary.txt"
    for t in test_ops_cuda test_model_cuda test_hf_model_cuda; do step "$t" 300 "$bin/$t" & done
    wait
    pack
    step hf_fixtures 300 python3 scripts/fixtures/make_hf_fixtures.py --cuda-shapes --out "$logs/fixtures" &&
        step hf_roundtrip 500 bash scripts/repro/hf_roundtrip.sh "$bin/train" "$logs/fixtures" "$logs/runs" cuda
    [ -f "$logs/hf_roundtrip.log" ] && show "$logs/hf_roundtrip.log" '^(OK|FAIL|info)'
    pack
}

mode_curves() {
    begin curves
    step curves 580 env TRAIN="$bin/train" bash scripts/repro/loss_curves.sh --runs "$logs/runs" \
        --png "$logs/loss_curves.png" --md "$logs/LOSS_CURVES.md" --set train.checkpoint_every=0
    show "$logs/curves.log" '^\|'
    pack
}

mode_walltime() {
    local m name
    begin walltime
    for m in ${WALLTIME_MODELS:-configs/hf/qwen3-0.6b}; do
        name=walltime_$(basename "$m")
        step "$name" 580 env TRAIN="$bin/train" bash scripts/repro/layout_walltime.sh --model "$m" \
            --profile "${WALLTIME_PROFILE:-chat}" --runs "$scratch/$name" --md "$logs/$name.md"
        show "$logs/$name.log" '^\|'
        pack
    done
}

# ab DIR_A DIR_B: the attention of two bundles checked, then timed alternately.
mode_ab() {
    local a=$1 b=$2 round side dir c trainer=0
    begin ab
    [ -x "$a/bench_trainer" ] && [ -x "$b/bench_trainer" ] && trainer=1
    step A_test_attention_cuda 300 "$a/test_attention_cuda" &
    step B_test_attention_cuda 300 "$b/test_attention_cuda" &
    step B_racecheck 300 env ATTN_TEST_QUICK=1 compute-sanitizer --error-exitcode 1 --tool racecheck \
        --racecheck-report all "$b/test_attention_cuda" &
    wait
    pack
    for round in 1 2; do
        for side in A B; do
            dir=$a
            [ $side = B ] && dir=$b
            # shellcheck disable=SC2086
            step "${side}_bench_attention_$round" 200 "$dir/bench_attention" ${ATTN_SIZES:-}
            show "$logs/${side}_bench_attention_$round.log" '^ *[0-9]'
            if [ $trainer = 1 ]; then
                for c in small tinyllama; do
                    step "${side}_trainer_${c}_$round" 150 "$dir/bench_trainer" --config "configs/bench_$c.json"
                    show "$logs/${side}_trainer_${c}_$round.log" '^\{'
                done
            fi
            pack
        done
    done
}

# ---------------------------------------------------------------- arguments and checks
[ $# -ge 1 ] || usage
mode=$1
args=()
for a in "${@:2}"; do args+=("$(realpath -m "$a")"); done  # the folders, before the cd
cd "$(dirname "$0")/.." || exit 2
if [ "$mode" = targets ]; then
    if [ $# != 2 ] || ! targets "$2"; then usage; fi
    exit 0
fi
if [ "$mode" = ab ]; then
    [ $# = 4 ] || usage
    dir_a=${args[0]} bin=${args[1]} out=${args[2]}
    for d in "$dir_a" "$bin"; do [ -d "$d" ] || { echo "run_gpu.sh: no bundle folder $d" >&2; exit 2; }; done
    need "$dir_a" ab bench_trainer
    need "$bin" ab bench_trainer
else
    if [ $# != 3 ] || ! targets "$mode" > /dev/null; then usage; fi
    bin=${args[0]} out=${args[1]}
    [ -d "$bin" ] || { echo "run_gpu.sh: no bundle folder $bin" >&2; exit 2; }
    need "$bin" "$mode"
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "run_gpu.sh: SKIP: no NVIDIA GPU here (nvidia-smi lists none); this runs on the GPU machine" >&2
    exit 77
fi
mkdir -p "$out" || exit 2
scratch=$(mktemp -d /tmp/run_gpu.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
work=$scratch/logs  # what logs.tar.gz holds
mkdir -p "$work"
bin=$(unpack "$bin" bin) || exit 2
if [ "$mode" = ab ]; then dir_a=$(unpack "$dir_a" bin_a) || exit 2; fi
rm -f "$out/summary.txt"
export PATH=$PATH:/usr/local/cuda/bin  # compute-sanitizer, ncu
# RUNPATH $ORIGIN covers a binary's own libraries, not theirs (cairo's pixman): the bundle is on the path.
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -z "${ONEPASS_NCCL_LIBRARY:-}" ]; then  # opened at run time (dist/nccl_cuda.cu); PyTorch ships one
    ONEPASS_NCCL_LIBRARY=$(find /usr /opt -name libnccl.so.2 2>/dev/null | head -n 1)
    export ONEPASS_NCCL_LIBRARY
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    echo "libcudnn: $(ldconfig -p | grep -m1 'libcudnn.so.9 ' | sed 's/.*=> //'); libnccl: ${ONEPASS_NCCL_LIBRARY:-none}"
} 2>&1 | tee -a "$out/summary.txt"

case "$mode" in
    all) for m in tests attention trainer decode hf; do "mode_$m"; done ;;
    ab) mode_ab "$dir_a" "$bin" ;;
    *) "mode_$mode" ;;
esac
pack
if [ -s "$work/failed" ]; then
    report "FAILED: $(tr '\n' ' ' < "$work/failed")"
    exit 1
fi
report "every step passed or skipped"
