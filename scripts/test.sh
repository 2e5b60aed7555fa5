#!/usr/bin/env bash
# Builds and runs the whole test suite. GPU tests print SKIP without a GPU.
#   scripts/test.sh             release build in build/, all tests
#   scripts/test.sh --sanitize  ASan+UBSan build (CPU code) in build-asan/, all tests
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
    BUILD_DIR=build-asan scripts/install.sh -DCMAKE_BUILD_TYPE=Debug -DONEPASS_SANITIZE=ON -DONEPASS_CUDA=OFF
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ctest --test-dir build-asan --output-on-failure -j 2
else
    scripts/install.sh
    ctest --test-dir build --output-on-failure -j 2
fi
