#!/usr/bin/env bash
# `train pack` on a few lines of the shipped synthetic data: the output format (one
# JSON object per row, 8 arrays of seq_len), the statistics, and bad input.
train="$1"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
data=datasets/synthetic
for f in train.jsonl shared_prefix.jsonl tokenizer.model; do
    [ -f "$data/$f" ] || { echo "skip: $data/$f not generated yet"; exit 77; }
done
pass=0; fail=0; declare -A trained
ok() { pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }

head -n 12 "$data/train.jsonl" > "$tmp/conv.jsonl"
head -n 6 "$data/shared_prefix.jsonl" > "$tmp/sp.jsonl"
pack() { "$train" pack --set data.tokenizer="$data/tokenizer.model" --set data.seq_len=2048 "$@"; }

# Every line: {"tokens": [...], "targets": [...], "pos": [...], "lo": [...], "hi": [...],
# "doc": [...], "turn": [...], "role": [...]} in this order, each array of seq_len ints;
# lo <= hi, padding (doc -1) has lo = hi = slot and no target, and a target is always
# the next slot's token (trained ranges are contiguous in every layout).
check_rows() {  # check_rows <file> <seq_len>
    awk -v L="$2" '
    function fail(msg) { print "row " NR ": " msg; bad = 1; exit 1 }
    {
        if ($0 !~ /^\{"tokens": \[[-0-9, ]*\], "targets": \[[-0-9, ]*\], "pos": \[[-0-9, ]*\], "lo": \[[-0-9, ]*\], "hi": \[[-0-9, ]*\], "doc": \[[-0-9, ]*\], "turn": \[[-0-9, ]*\], "role": \[[-0-9, ]*\]\}$/)
            fail("not the row format")
        line = $0
        gsub(/"[a-z]+": /, "", line); gsub(/[{}]/, "", line)
        n = split(line, field, /\], \[/)
        if (n != 8) fail(n " arrays")
        for (f = 1; f <= 8; f++) {
            gsub(/[\[\]]/, "", field[f])
            if (split(field[f], v, ", ") != L) fail("array " f " has " length(v) " values, want " L)
            for (i = 1; i <= L; i++) a[f, i] = v[i] + 0
        }
        for (i = 1; i <= L; i++) {
            if (a[4, i] > a[5, i]) fail("slot " i - 1 ": lo > hi")
            if (a[6, i] == -1 && (a[4, i] != i - 1 || a[5, i] != i - 1 || a[2, i] != -1))
                fail("padding slot " i - 1 " is visible or trained")
            if (a[2, i] != -1) {
                trained++
                if (i == L || a[2, i] != a[1, i + 1]) fail("slot " i - 1 ": target is not the next token")
            }
        }
        rows++
    }
    END { if (!bad && (rows == 0 || trained == 0)) { print "no rows or nothing trained"; exit 1 } }' "$1"
}

for layout in npass mask_only duplicate; do
    if out=$(pack --set data.train_path="$tmp/conv.jsonl" --set data.layout=$layout --out "$tmp/$layout.jsonl" 2>&1); then
        if msg=$(check_rows "$tmp/$layout.jsonl" 2048); then ok; else bad "$layout rows: $msg"; fi
        if grep -q "packing efficiency" <<<"$out" && grep -q "layout *$layout" <<<"$out"; then ok; else bad "$layout statistics: $out"; fi
        trained[$layout]=$(awk '/^trained tokens/ {sub(/\)/, "", $5); print $3 "/" $5}' <<<"$out")
    else
        bad "pack $layout: $out"
    fi
done
# Every layout trains the same positions as npass: "trained tokens N (npass N)".
for layout in npass mask_only duplicate; do
    t=${trained[$layout]}
    if [ -n "$t" ] && [ "${t%/*}" = "${t#*/}" ] && [ "$t" = "${trained[npass]}" ]; then ok; else bad "$layout trained $t vs npass ${trained[npass]}"; fi
done
if out=$(pack --set data.train_path="$tmp/sp.jsonl" --set data.layout=shared_prefix --out "$tmp/sp_rows.jsonl" 2>&1) &&
   msg=$(check_rows "$tmp/sp_rows.jsonl" 2048); then ok; else bad "shared_prefix: $out $msg"; fi
if command -v python3 >/dev/null; then  # a real JSON parser, where there is one
    if python3 -c 'import json, sys
for line in open(sys.argv[1]): row = json.loads(line); assert len(row) == 8 and all(len(v) == 2048 for v in row.values())' "$tmp/duplicate.jsonl"; then ok; else bad "python3 json check"; fi
fi
if [ "$(stat -c %a "$tmp/duplicate.jsonl")" != 600 ]; then ok; else bad "output left with mkstemp's 0600"; fi

# Bad input: a malformed line names file:line; --skip-bad skips and reports it.
{ head -n 2 "$tmp/conv.jsonl"; echo '{"messages": [{"role": "user", "content": '; sed -n 3,4p "$tmp/conv.jsonl"; } > "$tmp/bad.jsonl"
echo "previous" > "$tmp/kept.jsonl"
if out=$(pack --set data.train_path="$tmp/bad.jsonl" --out "$tmp/kept.jsonl" 2>&1); then
    bad "malformed line: exit 0"
else
    if grep -q "bad.jsonl:3" <<<"$out"; then ok; else bad "malformed line: no bad.jsonl:3 in: $out"; fi
    if [ "$(cat "$tmp/kept.jsonl")" = previous ] && ! ls "$tmp"/kept.jsonl.tmp* >/dev/null 2>&1; then ok; else bad "a failed run touched the output"; fi
fi
if out=$(pack --set data.train_path="$tmp/bad.jsonl" --out "$tmp/skip.jsonl" --skip-bad 2>/dev/null) &&
   grep -q "^skipped *1 bad" <<<"$out" && grep -q "^conversations *4$" <<<"$out"; then ok; else bad "--skip-bad: $out"; fi
if out=$(pack --set data.train_path="$tmp/bad.jsonl" --set data.skip_bad=true --out "$tmp/skip.jsonl" 2>/dev/null) &&
   grep -q "^skipped *1 bad" <<<"$out"; then ok; else bad "data.skip_bad: $out"; fi

# A conversation longer than seq_len is an error naming its line, or skipped on request.
if out=$(pack --set data.train_path="$tmp/conv.jsonl" --set data.seq_len=16 --out "$tmp/short.jsonl" 2>&1); then
    bad "too long: exit 0"
elif grep -q "conv.jsonl:1: .*does not fit seq_len 16" <<<"$out"; then ok; else bad "too long: $out"; fi
head -n 1 "$tmp/conv.jsonl" > "$tmp/long.jsonl"; echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}' >> "$tmp/long.jsonl"
if out=$(pack --set data.train_path="$tmp/long.jsonl" --set data.seq_len=64 --set data.skip_too_long=true --out "$tmp/short.jsonl" 2>&1) &&
   grep -q "^skipped *0 bad, 1 too long" <<<"$out" && [ "$(wc -l < "$tmp/short.jsonl")" -eq 1 ]; then ok; else bad "skip_too_long: $out"; fi

# The longest conversation and the data.seq_len it needs: packing at that seq_len works,
# one token less refuses that very line (lines reversed: the longest is the last).
tac "$tmp/conv.jsonl" > "$tmp/reversed.jsonl"
for layout in duplicate npass; do
    out=$(pack --set data.train_path="$tmp/reversed.jsonl" --set data.layout=$layout --out "$tmp/x.jsonl" 2>&1)
    line=$(sed -n 's/^longest conversation *line \([0-9]*\): \([0-9]*\) tokens in one row, so data.seq_len >= \2 (it is 2048)$/\1/p' <<<"$out")
    need=$(sed -n 's/^longest conversation *line [0-9]*: \([0-9]*\) tokens.*/\1/p' <<<"$out")
    if [ -z "$line" ] || [ -z "$need" ]; then bad "$layout: no longest conversation line: $out"; continue; fi
    if "$train" pack --set data.tokenizer="$data/tokenizer.model" --set data.train_path="$tmp/reversed.jsonl" \
           --set data.layout=$layout --set data.seq_len="$need" --out "$tmp/x.jsonl" >/dev/null 2>&1; then ok
    else bad "$layout: data.seq_len=$need (the printed need) does not pack"; fi
    if out=$("$train" pack --set data.tokenizer="$data/tokenizer.model" --set data.train_path="$tmp/reversed.jsonl" \
           --set data.layout=$layout --set data.seq_len=$((need - 1)) --out "$tmp/x.jsonl" 2>&1); then
        bad "$layout: data.seq_len=$((need - 1)) packs"
    elif grep -q "reversed.jsonl:$line: .*does not fit seq_len $((need - 1))" <<<"$out"; then ok
    else bad "$layout: one less than the need refuses another line than $line: $out"; fi
done

# Unpacked: one document per row.
if out=$(pack --set data.train_path="$tmp/conv.jsonl" --set data.layout=npass --set data.unpacked=true --out "$tmp/unpacked.jsonl" 2>&1); then
    docs=$(awk '/^documents/ {print $2}' <<<"$out")
    if [ "$(wc -l < "$tmp/unpacked.jsonl")" -eq "$docs" ]; then ok; else bad "unpacked: $docs documents, $(wc -l < "$tmp/unpacked.jsonl") rows"; fi
else
    bad "unpacked: $out"
fi
# A layout that does not apply, and a bad layout name.
if out=$(pack --set data.train_path="$tmp/sp.jsonl" --set data.layout=duplicate --out "$tmp/x.jsonl" 2>&1); then bad "duplicate on shared-prefix sets: exit 0"
elif grep -q "sp.jsonl:1: layout duplicate does not apply" <<<"$out"; then ok; else bad "duplicate on shared-prefix: $out"; fi
if out=$(pack --set data.layout=bogus --out "$tmp/x.jsonl" 2>&1); then bad "bogus layout: exit 0"
elif grep -q "data.layout.*bogus" <<<"$out"; then ok; else bad "bogus layout: $out"; fi

# data.history_thinking keep: no view strips anything, so duplicate and mask_only lay out
# exactly what npass does (one causal pass per conversation) and say so; the rows are
# npass's rows. A template whose official text always strips refuses keep by name.
for layout in npass duplicate mask_only; do
    if out=$(pack --set data.train_path="$tmp/conv.jsonl" --set data.history_thinking=keep \
             --set data.layout=$layout --out "$tmp/keep_$layout.jsonl" 2>&1) &&
       grep -q "^history thinking *keep: every layout is one causal pass per conversation" <<<"$out" &&
       grep -q "^documents *12 " <<<"$out" && grep -q "^tokens .*(1.000 x npass)" <<<"$out"; then ok
    else bad "keep, $layout: $out"; fi
done
cmp -s "$tmp/keep_npass.jsonl" "$tmp/keep_duplicate.jsonl" && cmp -s "$tmp/keep_npass.jsonl" "$tmp/keep_mask_only.jsonl" \
    && ok || bad "keep: the layouts' rows differ from npass's"
if out=$(pack --set data.train_path="$tmp/conv.jsonl" --set data.layout=duplicate --out "$tmp/strip.jsonl" 2>&1) &&
   grep -q "^history thinking *strip$" <<<"$out" && ! cmp -s "$tmp/strip.jsonl" "$tmp/keep_duplicate.jsonl"; then ok
else bad "strip: $out"; fi
if out=$(pack --set data.train_path="$tmp/conv.jsonl" --set data.chat_template=qwen3 --set data.history_thinking=keep \
         --out "$tmp/x.jsonl" 2>&1); then bad "keep under qwen3: exit 0"
elif grep -q "config key 'data.history_thinking': keep: the qwen3 template renders earlier turns without their reasoning" <<<"$out"; then ok
else bad "keep under qwen3: $out"; fi

# --show LINE: the line's document as written to the rows, token by token (slot, token,
# target taken from the table against the row's arrays), and its text in segments.
for layout in duplicate mask_only; do
    out=$(pack --set data.train_path="$tmp/conv.jsonl" --set data.layout=$layout --out "$tmp/show.jsonl" --show 2 2>&1) \
        || bad "--show under $layout: $out"
    read -r d r s e < <(sed -n 's/^document \([0-9]*\): row \([0-9]*\), slots \([0-9]*\)\.\.\([0-9]*\),.*/\1 \2 \3 \4/p' <<<"$out")
    awk '/^ +[0-9]+ +[0-9]+ +-?[0-9]+ +[a-z]+ +[0-9]+ "/ { print $1, $5, ($NF == "-" ? -1 : $(NF - 1)) }' \
        <<<"$out" > "$tmp/shown.txt"
    awk -v R="$r" -v S="$s" -v E="$e" -v D="$d" 'NR == R + 1 {
        line = $0; gsub(/"[a-z]+": /, "", line); gsub(/[{}]/, "", line); gsub(/^\[|\]$/, "", line)
        split(line, field, /\], \[/); split(field[1], tok, /, /); split(field[2], tgt, /, /); split(field[6], doc, /, /)
        for (i = S + 1; i <= E + 1; i++) { if (doc[i] != D) print "doc", i - 1, doc[i]; print i - 1, tok[i], tgt[i] }
        if (E + 2 <= length(doc) && doc[E + 2] == D) print "longer"; if (S > 0 && doc[S] == D) print "earlier" }' "$tmp/show.jsonl" > "$tmp/written.txt"
    if [ -n "$e" ] && [ "$(wc -l < "$tmp/shown.txt")" -eq $((e - s + 1)) ] && cmp -s "$tmp/shown.txt" "$tmp/written.txt"; then ok
    else bad "--show under $layout: the table differs from the written row $r: $(diff "$tmp/shown.txt" "$tmp/written.txt" | head -5)"; fi
    # The line's first user text (a ShareGPT line: the value after "from": "human").
    user=$(sed -n 2p "$tmp/conv.jsonl" | grep -o '"\(role\|from\)": *"\(user\|human\)", *"\(content\|value\)": *"[^"]*"' | head -1 | sed 's/.*": *"\(.*\)"$/\1/')
    if [ -n "$user" ] && grep -qF "$user" <<<"$out" && grep -qF "[turn 0 think, trained]<think>" <<<"$out" &&
       grep -q "\[turn 1 answer, trained\]" <<<"$out"; then ok; else bad "--show under $layout: text segments: $(grep -A3 '^text:' <<<"$out")"; fi
done
if out=$(pack --set data.train_path="$tmp/conv.jsonl" --out "$tmp/x.jsonl" --show 99 2>&1); then bad "--show 99: exit 0"
elif grep -q "pack: --show 99: no sample of .* comes from line 99" <<<"$out"; then ok; else bad "--show 99: $out"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
