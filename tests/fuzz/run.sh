#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, -DONEPASS_FUZZ=ON) into BUILD_DIR and
# runs each for SECONDS, starting from its committed corpus (tests/fuzz/corpus/<target>:
# seeds from the shipped data and fixtures, and every earlier finding as a regression
# input) with its dictionary (tests/fuzz/dict/<target>.dict). New inputs go to a scratch
# corpus; a crash, a hang (over 10 s), a CHECK failure or memory past 2 GB stops the run
# with the input saved under BUILD_DIR/findings/ and exit status 1; so does a leak, in
# every target but run_config.
#   tests/fuzz/run.sh [SECONDS [BUILD_DIR [TARGET...]]]     (default 25, build-fuzz, all)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-25}"; build="${2:-build-fuzz}"; shift $(( $# < 2 ? $# : 2 ))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(dataset tokenizer_file encode safetensors hf_config run_config)
command -v clang >/dev/null || { echo "tests/fuzz/run.sh: clang is required" >&2; exit 1; }
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DONEPASS_FUZZ=ON \
    -DONEPASS_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p "$build/findings"
status=0
for t in "${targets[@]}"; do
    scratch="$build/corpus/$t"
    mkdir -p "$scratch"
    log="$build/fuzz_$t.log"
    # A leak is a finding, except in run_config: its refusals (fatal() returning to the
    # target) leave what they held, so it runs in a worker process that libFuzzer restarts
    # (-fork=1) and its memory limit only ends a worker.
    leaks=1; extra=()
    [ "$t" = run_config ] && leaks=0 && extra=(-fork=1 -ignore_ooms=1)
    if ASAN_OPTIONS=detect_leaks=$leaks:abort_on_error=1 \
        "$build/fuzz_$t" "${extra[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -detect_leaks=$leaks \
        -close_fd_mask=1 -print_final_stats=1 -dict="tests/fuzz/dict/$t.dict" \
        -artifact_prefix="$build/findings/$t-" "$scratch" "tests/fuzz/corpus/$t" > "$log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || true)
        [ -n "$runs" ] || runs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')  # -fork: the last pulse
        echo "fuzz_$t: $runs runs in ${seconds} s, nothing found"
    else
        status=1
        echo "fuzz_$t: FOUND something (add the input to tests/fuzz/corpus/$t once fixed):"
        grep -E "ERROR|SUMMARY|runtime error|CHECK failed|Test unit written" "$log" | head -20
    fi
done
exit $status
