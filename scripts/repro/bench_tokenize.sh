#!/usr/bin/env bash
# Tokenization speed on one core (docs/BENCHMARKS.md, "Tokenization"): makes a
# ~150k-vocabulary Qwen2-style byte-level BPE tokenizer with the fixture script (once, in
# $BENCH_TOKENIZER_DIR, default /tmp/onepass_bench_tokenizer; needs Python `tokenizers`
# and `sentencepiece`), then times bench_tokenize on the shipped training set with it and
# with the fixture tokenizers, pinned to one core.
#   scripts/repro/bench_tokenize.sh [BUILD_DIR]   (default build/)
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir="${1:-build}"
dir="${BENCH_TOKENIZER_DIR:-/tmp/onepass_bench_tokenizer}"
[ -f "$dir/tokenizer.json" ] || python3 scripts/fixtures/make_tokenizer_fixtures.py --bench "$dir"
for tok in "$dir" tests/data/tokenizers/qwen2 tests/data/tokenizers/llama3 \
           tests/data/tokenizers/sp_dummy datasets/synthetic/tokenizer.model; do
    taskset -c 0 "$build_dir/bench_tokenize" "$tok"
done
