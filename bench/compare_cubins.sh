#!/usr/bin/env bash
# Compares the machine code of the attention kernels between two trees: every attention/*.cu
# of commit BEFORE and of AFTER (a commit, or the working tree when left out) is compiled to
# a cubin with the build's CUDA flags, and each kernel's .text section is compared byte for
# byte, kernels matched by their demangled names (so a kernel may move to another file).
# Line tables (-lineinfo) and the other sections may differ; .text may not.
#   bench/compare_cubins.sh BEFORE [AFTER]
# Prints one line per kernel (same / DIFFERENT / only before / only after) and exits 1 unless
# every kernel is in both trees with the same bytes. Needs nvcc (NVCC, default
# /usr/local/cuda/bin/nvcc), readelf and c++filt; no GPU.
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 BEFORE [AFTER]" >&2; exit 2; }
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
FLAGS=(-cubin -gencode=arch=compute_90a,code=sm_90a -lineinfo --expt-relaxed-constexpr -O3 -std=c++17)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# tree NAME REV: attention/ and common/ of REV (empty: the working tree) under $work/NAME.
tree() {
  mkdir -p "$work/$1"
  if [ -n "$2" ]; then
    git archive "$2" attention common | tar -x -C "$work/$1"
  else
    cp -r attention common "$work/$1/"
  fi
}

# kernels NAME: compiles $work/NAME's attention/*.cu and writes $work/NAME.txt, one line per
# kernel: its demangled name, a tab, the sha256 of its .text bytes.
kernels() {
  local dir=$work/$1 cu cubin
  : >"$work/$1.txt"
  for cu in "$dir"/attention/*.cu; do
    cubin=$dir/$(basename "$cu" .cu).cubin
    "$NVCC" "${FLAGS[@]}" -I"$dir" -o "$cubin" "$cu"
    readelf -SW "$cubin" 2>/dev/null | sed -nE 's/^ *\[ *([0-9]+)\] +\.text\.([^ ]+) +PROGBITS .*/\1 \2/p' |
      while read -r idx sym; do
        # The dump's header line names the section (the mangled name, which holds a
        # per-file hash for the anonymous namespace): only the bytes are hashed.
        sum=$(readelf -W -x "$idx" "$cubin" 2>/dev/null | grep -E '^ +0x' | sha256sum | cut -c1-16)
        printf '%s\t%s\n' "$(c++filt <<<"$sym")" "$sum"
      done >>"$work/$1.txt"
  done
  sort -o "$work/$1.txt" "$work/$1.txt"
}

tree before "$1"
tree after "${2:-}"
kernels before
kernels after
status=0
while IFS=$'\t' read -r name b a; do
  if [ "$b" = "-" ]; then echo "only after:  $name"; status=1
  elif [ "$a" = "-" ]; then echo "only before: $name"; status=1
  elif [ "$a" = "$b" ]; then echo "same:        $name"
  else echo "DIFFERENT:   $name"; status=1
  fi
done < <(join -t $'\t' -a1 -a2 -e - -o 0,1.2,2.2 "$work/before.txt" "$work/after.txt")
n=$(wc -l <"$work/after.txt")
if [ $status -eq 0 ]; then echo "compare_cubins: the .text of all $n kernels is identical"
else echo "compare_cubins: differences (above)"; fi
exit $status
