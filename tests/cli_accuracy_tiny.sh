#!/usr/bin/env bash
# scripts/repro/accuracy_experiment.sh --tiny on the CPU: the five layouts trained from one
# seed on fresh data and evaluated end to end, and the table's shape: a row per layout with
# its accuracy, eval loss, tokens and wall time. The exact layout duplicate ends with
# npass's eval loss (same conversations per step, same gradients); every layout but
# as_rendered trains npass's trained tokens, as_rendered fewer per conversation (earlier
# turns' thinking is not trained) and so processes more conversations per step.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_data
out="$tmp/acc"
if log=$(BIN="$train" bash scripts/repro/accuracy_experiment.sh --seed 7 --tiny --backend cpu --out "$out" 2>&1); then ok
else bad "the tiny experiment failed: $(tail -5 <<<"$log")"; finish; fi
md="$out/ACCURACY.md"
# "| layout | accuracy | first | later | eval loss | answer loss | tokens | vs npass | trained | train s | eval s |"
row() { grep "^| $1 |" "$md" | head -1; }
field() { row "$1" | awk -F'|' -v f="$2" '{ gsub(/ /, "", $(f + 1)); print $(f + 1) }'; }
for layout in npass duplicate mask_only as_rendered preserve; do
    r=$(row "$layout")
    if [ "$(awk -F'|' '{ print NF }' <<<"$r")" -eq 13 ] &&
       awk -F'|' '{ for (i = 3; i <= 12; i++) { v = $i; gsub(/ /, "", v); if (v !~ /^[0-9.]+x?$/) exit 1 } }' <<<"$r"; then ok
    else bad "$layout row: '$r'"; fi
done
grep -q "accuracy_experiment.sh --seed 7 --tiny --backend cpu" "$md" && ok || bad "the table does not give its command"
[ "$(field npass 8)" = "1.00x" ] && ok || bad "npass vs npass: $(field npass 8)"
awk -v a="$(field npass 5)" -v b="$(field duplicate 5)" 'BEGIN { d = a - b; exit !(d < 2e-3 && d > -2e-3) }' \
    && ok || bad "duplicate's eval loss $(field duplicate 5) is not npass's $(field npass 5)"
for layout in duplicate mask_only preserve; do
    [ "$(field $layout 9)" = "$(field npass 9)" ] && ok || bad "$layout trained $(field $layout 9), npass $(field npass 9)"
done
[ "$(field as_rendered 9)" -lt "$(field npass 9)" ] && ok || bad "as_rendered trained $(field as_rendered 9), npass $(field npass 9)"
for layout in duplicate mask_only preserve; do  # one pass: fewer tokens than npass's passes
    [ "$(field $layout 7)" -lt "$(field npass 7)" ] && ok || bad "$layout processed $(field $layout 7), npass $(field npass 7)"
done
finish
