#!/usr/bin/env bash
# npass_equivalent_tokens_per_s on a tiny run: for each step, its ratio to tokens_per_s in
# metrics.jsonl is the step's npass tokens over its processed tokens, both read from
# `train pack` statistics of the step's conversation alone; the step line shows it.
train="$1"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
data=datasets/synthetic
for f in train.jsonl tokenizer.model; do
    [ -f "$data/$f" ] || { echo "skip: $data/$f not generated yet"; exit 77; }
done
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
check() { if eval "$2"; then ok; else bad "$1"; fi; }
export OMP_NUM_THREADS=2

head -n 3 "$data/train.jsonl" > "$tmp/conv.jsonl"
# train.tokens_per_step 1 and no shuffle: step k trains conversation k alone.
for layout in duplicate npass; do
    out="$tmp/$layout"
    if "$train" --set out_dir="$out" --set data.train_path="$tmp/conv.jsonl" \
        --set data.layout=$layout --set train.steps=2 --set train.tokens_per_step=1 \
        --set train.shuffle=false --set eval.every=0 --set data.seq_len=2048 \
        --set model.hidden_size=32 --set model.intermediate_size=64 \
        --set model.num_hidden_layers=1 > "$tmp/$layout.log" 2>&1; then ok
    else bad "$layout run: $(tail -3 "$tmp/$layout.log")"; continue; fi
    check "$layout: step line shows npass-eq tok/s" \
        "grep -Eq '^step 2/2 \| .* [0-9]+ tok/s \| [0-9]+ npass-eq tok/s \|' '$tmp/$layout.log'"
    for step in 1 2; do
        sed -n "${step}p" "$tmp/conv.jsonl" > "$tmp/one.jsonl"
        stats=$("$train" pack --set data.tokenizer="$data/tokenizer.model" --set data.seq_len=2048 \
            --set data.train_path="$tmp/one.jsonl" --set data.layout=$layout --out "$tmp/one.rows" 2>&1)
        tokens=$(awk '/^tokens / {print $2}' <<<"$stats")
        npass=$(awk '/^npass tokens / {print $3}' <<<"$stats")
        line=$(sed -n "${step}p" "$out/metrics.jsonl")
        got_tokens=$(grep -o '"tokens":[0-9]*' <<<"$line" | cut -d: -f2)
        tps=$(grep -o '"tokens_per_s":[^,}]*' <<<"$line" | cut -d: -f2)
        eq=$(grep -o '"npass_equivalent_tokens_per_s":[^,}]*' <<<"$line" | cut -d: -f2)
        check "$layout step $step: processed tokens $got_tokens = pack's $tokens" \
            "[ -n '$tokens' ] && [ '$got_tokens' = '$tokens' ]"
        check "$layout step $step: npass-eq/tok/s ($eq / $tps) = npass/tokens ($npass / $tokens)" \
            "awk -v e='$eq' -v t='$tps' -v n='$npass' -v p='$tokens' 'BEGIN { if (t <= 0 || p <= 0 || e == \"\") exit 1; r = e / t; w = n / p; d = r - w; if (d < 0) d = -d; exit !(d < 1e-9 * w) }'"
        [ "$layout" = duplicate ] && check "duplicate step $step: npass lays out more ($npass > $tokens)" \
            "[ '$npass' -gt '$tokens' ]"
    done
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
