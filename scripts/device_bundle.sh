#!/usr/bin/env bash
# Gathers built binaries and every shared library they load but the C/C++ runtime and
# CUDA's and cuDNN's (which the GPU machine has) into one folder to carry there:
# SentencePiece, OpenBLAS, PCRE2, utf8proc, cairo and their dependencies. cuDNN (hundreds
# of MB, over the carry limit) is never bundled: bench_attention dlopens it at run time,
# so ldd does not list it, and the filter below drops it should a binary ever link it.
# Binaries are linked with rpath $ORIGIN, so they find the libraries beside them.
#   scripts/device_bundle.sh BUILD_DIR OUT_DIR binary...
set -euo pipefail
build_dir="$1"; out_dir="$2"; shift 2
mkdir -p "$out_dir"
for bin in "$@"; do
    cp "$build_dir/$bin" "$out_dir/"
    ldd "$build_dir/$bin" | awk '/=> \// {print $3}' |
        grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libz|ld-linux[^/]*|libcuda[^/]*|libcudart|libcublas[^/]*|libcudnn[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" "$out_dir/"; done
done
ls -la "$out_dir" | awk '{s+=$5} END {print "bundle size:", s/1048576, "MiB"}'
