# Shared by the CLI tests (sourced; not a test itself: CTest globs tests/cli_*.sh).
# Sets $train (the binary, absolute) and $tmp (removed on exit); ok/bad count results,
# expect_error checks a failing command's message, finish prints the tally and exits;
# tensor_bytes compares checkpoints without their headers.
train="$(realpath "$1")"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
data=datasets/synthetic
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
expect_error() {  # expect_error <description> <pattern> <command...>
    local what="$1" pattern="$2"; shift 2
    if out=$("$@" 2>&1); then bad "$what: exit 0"; return; fi
    if grep -q -- "$pattern" <<<"$out"; then ok; else bad "$what: got: $(tail -2 <<<"$out")"; fi
}
check() { if eval "$2"; then ok; else bad "$1"; fi; }  # check <description> <shell test>
need_cuda() {  # exits 77 (SKIP) without a CUDA device or with a binary built without CUDA
    nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "SKIP: no CUDA device"; exit 77; }
    if "$train" --set backend=cuda --set out_dir="$tmp/probe" --set train.steps=0 2>&1 |
        grep -q 'built without CUDA'; then echo "SKIP: no CUDA device (binary built without CUDA)"; exit 77; fi
}
need_data() { [ -f "$data/train.jsonl" ] && [ -f "$data/tokenizer.model" ] || { echo "skip: $data not generated yet"; exit 77; }; }
# A safetensors file's tensor bytes (the header holds the per-save id, which differs).
tensor_bytes() { tail -c +$((9 + $(od -An -tu8 -N8 "$1" | tr -d ' '))) "$1"; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }
