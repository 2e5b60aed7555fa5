#!/usr/bin/env bash
# `train show` on the shipped synthetic data: the figures it writes (files, sizes, PNG
# pixel dimensions from the header, SVG), the tile counts it prints against `train
# pack`'s statistics for the same row, --rows, and bad arguments.
train="$1"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
data=datasets/synthetic
for f in train.jsonl shared_prefix.jsonl tokenizer.model; do
    [ -f "$data/$f" ] || { echo "skip: $data/$f not generated yet"; exit 77; }
done
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
common=(--set data.tokenizer="$data/tokenizer.model" --set data.seq_len=512)

# width and height of a PNG: the IHDR chunk's two big-endian 32-bit words at byte 16
png_size() { od -An -tu1 -j16 -N8 "$1" | awk '{ print $1*16777216+$2*65536+$3*256+$4, $5*16777216+$6*65536+$7*256+$8 }'; }
check_figures() {  # check_figures <dir> <name>...
    local dir=$1; shift
    for name in "$@"; do
        local png="$dir/$name.png" svg="$dir/$name.svg"
        if [ "$(head -c 8 "$png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" != 89504e470d0a1a0a ]; then
            bad "$png: missing or not a PNG"; continue
        fi
        read -r w h < <(png_size "$png")
        local bytes; bytes=$(stat -c %s "$png")
        if [ "$w" -ge 600 ] && [ "$w" -le 5000 ] && [ "$h" -ge 300 ] && [ "$h" -le 5000 ] &&
           [ "$bytes" -ge 5000 ] && [ "$bytes" -le 3000000 ]; then ok; else bad "$png: ${w}x${h}, $bytes bytes"; fi
        if head -c 200 "$svg" 2>/dev/null | grep -q '<svg' && [ "$(stat -c %s "$svg")" -ge 5000 ]; then ok; else bad "$svg: missing or not an SVG"; fi
    done
}
# "tiles 64x64 ..." of each layout's statistics block, as "layout: line"
tiles_lines() { awk '/^layout/ { layout = $2 } /^tiles/ { print layout ": " $0 }'; }

line=32
sed -n "${line}p" "$data/train.jsonl" > "$tmp/one.jsonl"
if out=$("$train" show "${common[@]}" --set data.train_path="$data/train.jsonl" --conversation $line --out "$tmp/conv" 2>&1); then
    ok
    check_figures "$tmp/conv" overview npass_strip npass_mask npass_tiles mask_only_strip mask_only_mask \
        mask_only_tiles mask_only_diff duplicate_strip duplicate_mask duplicate_tiles duplicate_diff
    if [ ! -e "$tmp/conv/npass_diff.png" ] && [ ! -e "$tmp/conv/shared_prefix_mask.png" ]; then ok; else bad "figures of a comparison or layout that does not apply"; fi
    read -r ow oh < <(png_size "$tmp/conv/overview.png"); read -r mw mh < <(png_size "$tmp/conv/duplicate_mask.png")
    if [ "$ow" -gt "$mw" ] && [ "$oh" -gt "$mh" ]; then ok; else bad "overview ${ow}x${oh} not larger than a mask ${mw}x${mh}"; fi
    # The tile counts equal `train pack`'s statistics for the same row (one row each here).
    for layout in npass mask_only duplicate; do
        packed=$("$train" pack "${common[@]}" --set data.train_path="$tmp/one.jsonl" --set data.layout=$layout --out "$tmp/$layout.jsonl" | tiles_lines)
        shown=$(tiles_lines <<<"$out" | grep "^$layout:")
        if [ -n "$packed" ] && [ "$packed" = "$shown" ]; then ok; else bad "$layout tiles: show '$shown', pack '$packed'"; fi
        # "drawn ... row 1 of 1: empty E  partial P  full F  (T tiles" against pack's percentages
        drawn=$(awk -v l=$layout '/^layout/ { layout = $2 } /^drawn/ && layout == l {
            t = $12; sub(/\(/, "", t); printf "empty %.1f%%  partial %.1f%%  full %.1f%%  (%d tiles)", 100*$7/t, 100*$9/t, 100*$11/t, t }' <<<"$out")
        if [ -n "$drawn" ] && grep -qF "$drawn" <<<"$packed"; then ok; else bad "$layout drawn row: '$drawn' vs '$packed'"; fi
    done
    if grep -q "^against npass *0 of [0-9]* visible pairs differ; 0 of" <<<"$(awk '/^layout/ {l=$2} l=="duplicate"' <<<"$out")"; then ok; else bad "duplicate is not exact against npass: $out"; fi
    if grep -q "^against npass *[1-9][0-9]* of" <<<"$(awk '/^layout/ {l=$2} l=="mask_only"' <<<"$out")"; then ok; else bad "mask_only shows no difference from npass: $out"; fi
    # The trainers' one-pass layouts: as_rendered trains earlier answers without their
    # thinking, fewer positions, some inexact; preserve trains all of them, later turns
    # seeing earlier thinking.
    check_figures "$tmp/conv" as_rendered_strip as_rendered_mask as_rendered_diff preserve_strip preserve_mask preserve_diff
    rendered=$(awk '/^layout/ {l=$2} l=="as_rendered"' <<<"$out"); preserved=$(awk '/^layout/ {l=$2} l=="preserve"' <<<"$out")
    npass_trained=$(awk '/^layout/ {l=$2} l=="npass" && /^trained tokens/ {print $3}' <<<"$out")
    if grep -q "^against npass *[1-9][0-9]* of [0-9]* visible pairs differ; [1-9][0-9]* of [0-9]* trained positions inexact" <<<"$rendered" &&
       [ "$(awk '/^trained tokens/ {print $3}' <<<"$rendered")" -lt "$npass_trained" ]; then ok; else bad "as_rendered against npass: $rendered"; fi
    if grep -q "^against npass *[1-9][0-9]* of [0-9]* visible pairs differ; [1-9][0-9]* of $npass_trained trained positions inexact" <<<"$preserved"; then ok
    else bad "preserve against npass: $preserved"; fi
else
    bad "show conversation: $out"
fi

# data.history_thinking keep: nothing is stripped, so every layout is npass's one pass: no
# pair and no trained position differs, in any layout.
if out=$("$train" show "${common[@]}" --set data.history_thinking=keep --set data.train_path="$data/train.jsonl" \
         --conversation $line --out "$tmp/keep" 2>&1); then
    check_figures "$tmp/keep" overview mask_only_diff as_rendered_diff preserve_diff
    n=$(grep -c "^against npass *0 of [0-9]* visible pairs differ; 0 of [1-9][0-9]* trained positions inexact" <<<"$out")
    [ "$n" -eq 4 ] && ok || bad "keep: $n of 4 layouts exact against npass: $out"
else
    bad "show under keep: $out"
fi

# A shared-prefix set: npass (separate passes) and shared_prefix, which is exact.
if out=$("$train" show "${common[@]}" --set data.train_path="$data/shared_prefix.jsonl" --conversation 1 --out "$tmp/sp" 2>&1); then
    check_figures "$tmp/sp" overview npass_mask shared_prefix_strip shared_prefix_mask shared_prefix_tiles shared_prefix_diff
    if grep -q "^against npass *0 of" <<<"$out"; then ok; else bad "shared_prefix not exact: $out"; fi
else
    bad "show shared-prefix set: $out"
fi

# --rows: several conversations packed, document boundaries in the figures.
if out=$("$train" show "${common[@]}" --set data.seq_len=1024 --set data.train_path="$data/train.jsonl" --conversation 1 --rows --out "$tmp/rows" 2>&1) &&
   grep -q "^conversations *16$" <<<"$out"; then
    check_figures "$tmp/rows" overview duplicate_mask npass_tiles mask_only_diff
else
    bad "show --rows: $out"
fi

# Bad arguments name what is wrong.
if out=$("$train" show "${common[@]}" --out "$tmp/x" 2>&1); then bad "no --conversation: exit 0"
elif grep -q "conversation N and --out DIR are required" <<<"$out"; then ok; else bad "no --conversation: $out"; fi
if out=$("$train" show "${common[@]}" --conversation 999999 --out "$tmp/x" 2>&1); then bad "line past the end: exit 0"
elif grep -q "has no sample on line 999999" <<<"$out"; then ok; else bad "line past the end: $out"; fi
if out=$("$train" show "${common[@]}" --conversation 0 --out "$tmp/x" 2>&1); then bad "--conversation 0: exit 0"
elif grep -q "wants a line number" <<<"$out"; then ok; else bad "--conversation 0: $out"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
