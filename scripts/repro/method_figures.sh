#!/usr/bin/env bash
# Regenerates the figures of docs/METHOD.md with `train show` on the shipped data:
#   scripts/repro/method_figures.sh [path/to/train]     (default: build/train)
# Writes every figure into a scratch folder and copies the ones the guide shows into
# docs/method/ (PNG; the SVGs stay in the scratch folder, printed at the end).
set -euo pipefail
cd "$(dirname "$0")/../.."
train="${1:-build/train}"
[ -x "$train" ] || { echo "no $train: build first (scripts/install.sh)" >&2; exit 1; }
scratch="${METHOD_SCRATCH:-$(mktemp -d)}"
out=docs/method
mkdir -p "$scratch"
mkdir -p "$out"
config=configs/strip_thinking.json

# One conversation of 3 turns (line 329), in a row that holds npass's 3 documents too.
"$train" show --config "$config" --set data.seq_len=448 --conversation 329 --out "$scratch/conversation"
# One shared-prefix set (2 completions).
"$train" show --config "$config" --set data.seq_len=320 \
    --set data.train_path=datasets/synthetic/shared_prefix.jsonl --conversation 1 --out "$scratch/shared"
# A packed row of several conversations (FFD, documents never split), at the training seq_len.
"$train" show --config "$config" --conversation 1 --rows --out "$scratch/rows"

for f in overview npass_strip mask_only_strip duplicate_strip npass_mask mask_only_mask duplicate_mask \
         npass_tiles mask_only_tiles duplicate_tiles mask_only_diff duplicate_diff; do
    cp "$scratch/conversation/$f.png" "$out/conversation_$f.png"
done
for f in shared_prefix_strip shared_prefix_mask; do cp "$scratch/shared/$f.png" "$out/$f.png"; done
for f in npass_strip npass_mask duplicate_tiles; do cp "$scratch/rows/$f.png" "$out/rows_$f.png"; done
echo "figures in $out/; every PNG and SVG in $scratch/"
