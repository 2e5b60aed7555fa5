#!/usr/bin/env bash
# One device call for the training-step performance work: the CUDA op, model and
# attention tests, bench_trainer on both benchmark configs, then the same step with
# per-stage CUDA-event timing (ONEPASS_STAGE_TIMES=1, model/stage_timer_cuda.cu). Expects
#   scripts/device_bundle.sh build-perf .device/perf test_ops_cuda test_model_cuda \
#       test_attention_cuda bench_trainer
# and the call carrying .device/perf. With --det, bench_trainer also runs with the
# deterministic attention backward. Logs to $OUT; the summary is printed last.
set -u
out=${OUT:-/tmp/perf_out}; mkdir -p "$out"
bin=.device/perf
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$out/info.log"
for t in test_ops_cuda test_model_cuda test_attention_cuda; do
    timeout 150 $bin/$t > "$out/$t.log" 2>&1
    echo "== $t rc=$? $(grep -E '^[0-9]+ passed' "$out/$t.log" | tail -1)"
    grep -E "FAIL" "$out/$t.log" | head -5
done
for c in small tinyllama; do
    ONEPASS_STAGE_TIMES=1 timeout 150 $bin/bench_trainer --config configs/bench_$c.json 6 2>&1 |
        grep '^{' >> "$out/stages.log"
done
modes=false; [ "${1:-}" = "--det" ] && modes="false true"
for c in small tinyllama; do
    for det in $modes; do
        timeout 150 $bin/bench_trainer --config configs/bench_$c.json \
            --set train.deterministic=$det 2>&1 | grep '^{' >> "$out/bench.log"
    done
done
echo "== stage times (ms per step)"; cat "$out/stages.log"
echo "== bench_trainer"; cat "$out/bench.log"
