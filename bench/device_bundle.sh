#!/usr/bin/env bash
# Packs built binaries, and every shared library they load that the GPU machine lacks,
# into OUT_DIR/bundle.tar.gz to carry there (bench/run_gpu.sh unpacks it): all but the C/C++
# runtime and CUDA's and cuDNN's, so SentencePiece, OpenBLAS, libgomp, Jansson, PCRE2,
# utf8proc, cairo and their own dependencies. cuDNN (hundreds of MB, over the carry limit)
# is never bundled: bench_attention dlopens it at run time, so ldd does not list it, and
# the filter below drops it should a binary ever link it. The binaries go without their
# debug sections; they are linked with rpath $ORIGIN, so they find the libraries beside them.
# `bench/run_gpu.sh targets MODE` names the binaries a mode runs.
#   bench/device_bundle.sh BUILD_DIR OUT_DIR binary...
set -euo pipefail
[ $# -ge 3 ] || { sed -n '10s/^#  *//p' "$0" >&2; exit 2; }
build_dir="$1"; out_dir="$2"; shift 2
carry_limit_mib=64  # what one device call carries, the working tree included
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for bin in "$@"; do
    strip --strip-debug -o "$stage/$bin" "$build_dir/$bin"
    ldd "$build_dir/$bin" | awk '/=> \// {print $3}' |
        grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libz|ld-linux[^/]*|libcuda[^/]*|libcudart|libcublas[^/]*|libcudnn[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" "$stage/"; done
done
mkdir -p "$out_dir"
tar -C "$stage" -czf "$out_dir/bundle.tar.gz" .
size_mib=$(du -m "$out_dir/bundle.tar.gz" | cut -f1)
echo "bundle $out_dir/bundle.tar.gz: $size_mib MiB ($(du -sm "$stage" | cut -f1) MiB unpacked)"
if [ "$size_mib" -ge "$carry_limit_mib" ]; then
    echo "device_bundle.sh: over a device call's carry ($carry_limit_mib MiB with the working tree): bundle fewer binaries" >&2
    exit 1
fi
