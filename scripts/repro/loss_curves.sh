#!/usr/bin/env bash
# Trains npass, duplicate (option b) and mask_only (option a) from the same seed on the
# same conversations per step (the step budget counts trained tokens, equal under every
# layout), then plots training and eval loss against step into one PNG with gnuplot and
# writes a table of final numbers, tokens processed and wall time per layout.
#
# usage: scripts/repro/loss_curves.sh [--config FILE] [--runs DIR] [--png FILE] [--md FILE]
#                               [--plot-only] [--set key=value]...
#   defaults: configs/strip_thinking.json, runs/loss_curves, and the plot and table in the
#   runs folder (docs/ changes only when --png or --md name
#   it); relative paths are from the repository root. --set overrides go
#   to every run (e.g. --set train.steps=100). --plot-only redraws from existing runs.
# Needs the built trainer (./train, or the binary named by $TRAIN); the plot needs gnuplot
# (Debian: gnuplot-nox): without it (the GPU machine) the runs and the table are made and
# --plot-only draws the plot later on a machine that has it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"  # the configs name data files relative to the repository root
config="$root/configs/strip_thinking.json"
runs="$root/runs/loss_curves"
png=""
md=""
train="${TRAIN:-$root/train}"
overrides=()
plot_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --config) config="$2"; shift 2 ;;
        --runs) runs="$2"; shift 2 ;;
        --png) png="$2"; shift 2 ;;
        --md) md="$2"; shift 2 ;;
        --set) overrides+=(--set "$2"); shift 2 ;;
        --plot-only) plot_only=1; shift ;;
        *) echo "loss_curves.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
png="${png:-$runs/loss_curves.png}"
md="${md:-$runs/LOSS_CURVES.md}"
layouts=(npass duplicate mask_only)
mkdir -p "$runs" "$(dirname "$png")" "$(dirname "$md")"

# Pulls a numeric field out of one metrics.jsonl line (no jq: plain awk).
field_awk='function field(line, key,   m) {
    if (match(line, "\"" key "\":[-0-9.eE+naif]+")) return substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
    return "" }'

for layout in "${layouts[@]}"; do
    out="$runs/$layout"
    if [ "$plot_only" -eq 0 ]; then
        rm -rf "$out"
        echo "== $layout -> $out"
        start=$(date +%s.%N)
        "$train" --config "$config" --set data.layout="$layout" --set out_dir="$out" \
            "${overrides[@]}" > "$runs/$layout.log" 2>&1 \
            || { echo "training $layout failed; see $runs/$layout.log" >&2; tail -5 "$runs/$layout.log" >&2; exit 1; }
        awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f\n", b - a}' > "$out/wall_s"
    fi
    [ -s "$out/metrics.jsonl" ] || { echo "no metrics in $out (run without --plot-only first)" >&2; exit 1; }
    # step, loss, and an exponential moving average of the loss (the raw curve is noisy)
    awk "$field_awk"'{ l = field($0, "loss"); ema = NR == 1 ? l : 0.9 * ema + 0.1 * l
                      print field($0, "step"), l, ema }' "$out/metrics.jsonl" > "$out/train.dat"
    awk "$field_awk"'/"eval_loss"/ { print field($0, "step"), field($0, "eval_loss"), field($0, "eval_answer_loss") }' \
        "$out/metrics.jsonl" > "$out/eval.dat"
done

wrote="$md"
if command -v gnuplot > /dev/null; then
    wrote="$png and $md"
    gnuplot <<EOF
set terminal pngcairo size 1400,520 font ",11"
set output "$png"
set multiplot layout 1,2 title "npass vs duplicate (b) vs mask\\\\_only (a): same seed, same conversations per step"
set grid
set autoscale yfix
set offsets 0, 0, graph 0.05, graph 0.05
set xlabel "step"
set key top right
set style line 1 lc rgb "#7b3294" lw 2
set style line 2 lc rgb "#1b9e77" lw 2 dt 2
set style line 3 lc rgb "#e66101" lw 2
set ylabel "training loss (EMA 0.9)"
plot "$runs/npass/train.dat" using 1:3 with lines ls 1 title "npass", \\
     "$runs/duplicate/train.dat" using 1:3 with lines ls 2 title "duplicate (b)", \\
     "$runs/mask_only/train.dat" using 1:3 with lines ls 3 title "mask\\\\_only (a)"
set ylabel "eval loss (thick: think+answer, thin: answer)"
plot "$runs/npass/eval.dat" using 1:2 with linespoints ls 1 title "npass", \\
     "$runs/duplicate/eval.dat" using 1:2 with linespoints ls 2 title "duplicate (b)", \\
     "$runs/mask_only/eval.dat" using 1:2 with linespoints ls 3 title "mask\\\\_only (a)", \\
     "$runs/npass/eval.dat" using 1:3 with linespoints ls 1 lw 1 notitle, \\
     "$runs/duplicate/eval.dat" using 1:3 with linespoints ls 2 lw 1 notitle, \\
     "$runs/mask_only/eval.dat" using 1:3 with linespoints ls 3 lw 1 notitle
unset multiplot
EOF
else
    echo "loss_curves.sh: no gnuplot here (apt-get install gnuplot-nox): table only; --plot-only plots later"
fi

table="| layout | steps | final train loss | final eval loss | final eval answer loss | tokens processed | trained tokens | wall time (s) |
|---|---|---|---|---|---|---|---|"
for layout in "${layouts[@]}"; do
    row=$(awk "$field_awk"'{ tokens += field($0, "tokens"); trained += field($0, "trained_tokens")
                             step = field($0, "step"); loss = field($0, "loss")
                             if (field($0, "eval_loss") != "") { ev = field($0, "eval_loss"); ea = field($0, "eval_answer_loss") } }
          END { printf "%d | %.4f | %.4f | %.4f | %d | %d", step, loss, ev, ea, tokens, trained }' \
          "$runs/$layout/metrics.jsonl")
    table+=$'\n'"| $layout | $row | $(cat "$runs/$layout/wall_s" 2>/dev/null || echo n/a) |"
done
echo "$table"

cat > "$md" <<EOF
# Loss curves: npass vs duplicate (b) vs mask_only (a)

Produced by \`scripts/repro/loss_curves.sh\` (config \`${config#"$root"/}\`${overrides[*]:+, overrides \`${overrides[*]}\`}).
All three runs start from the same seed and train on the same conversations at every
step: the step budget counts trained tokens, which are the same under every layout.
Eval loss is measured in the inference view (npass layout) on held-out conversations:
"eval loss" over think+answer targets, "answer" over answer targets only.
Wall time includes data loading and evaluation; tokens processed counts the
non-padding tokens each layout needs for the same trained tokens.

![loss curves]($(basename "$png"))

$table
EOF
echo "wrote $wrote"
