#!/usr/bin/env bash
# Gathers built binaries and the shared libraries the GPU machine lacks
# (SentencePiece, OpenBLAS, PCRE2, utf8proc and their runtimes) into one folder to carry there.
# Binaries are linked with rpath $ORIGIN, so they find the libraries beside them.
#   scripts/device_bundle.sh BUILD_DIR OUT_DIR binary...
set -euo pipefail
build_dir="$1"; out_dir="$2"; shift 2
mkdir -p "$out_dir"
for bin in "$@"; do
    cp "$build_dir/$bin" "$out_dir/"
    ldd "$build_dir/$bin" | awk '/=> \// {print $3}' |
        grep -E 'sentencepiece|openblas|gfortran|quadmath|gomp|protobuf|jansson|pcre2|utf8proc' |
        while read -r lib; do cp -L "$lib" "$out_dir/"; done
done
ls -la "$out_dir" | awk '{s+=$5} END {print "bundle size:", s/1048576, "MiB"}'
