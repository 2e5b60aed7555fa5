# Shared by the CLI tests (sourced; not a test itself: CTest globs tests/cli_*.sh).
# Sets $train (the binary, absolute) and $tmp (removed on exit); ok/bad count results,
# expect_error checks a failing command's message, finish prints the tally and exits;
# tensor_bytes and same_checkpoint compare checkpoints without their headers; run_into
# trains into $tmp/NAME.
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
# same_checkpoint A B: the tensor bytes of two checkpoints' model and optimizer files.
same_checkpoint() {
    cmp <(tensor_bytes "$1/model.safetensors") <(tensor_bytes "$2/model.safetensors") &&
        cmp <(tensor_bytes "$1/optimizer.safetensors") <(tensor_bytes "$2/optimizer.safetensors")
}
# run_into NAME ARGS...: train with the caller's array short and ARGS into $tmp/NAME, its
# console in $tmp/NAME.log, counted ok or bad.
run_into() {
    local name=$1; shift
    "$train" --set out_dir="$tmp/$name" "${short[@]}" "$@" > "$tmp/$name.log" 2>&1 && ok ||
        bad "$name: $(tail -3 "$tmp/$name.log")"
}
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }
