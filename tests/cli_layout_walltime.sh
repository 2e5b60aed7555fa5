#!/usr/bin/env bash
# scripts/repro/layout_walltime.sh --tiny end to end on the CPU (npass and duplicate):
# both runs train, the table has a row per layout with npass's own ratios 1 and its
# npass-equivalent rate equal to its rate, duplicate processing fewer tokens than npass
# for the same conversations; --table-only writes the same table again from the runs'
# metrics (and trains nothing: the runs' logs stay as they were); gen-data --profile
# refuses an unknown profile.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
expect_error "unknown profile" "gen-data: --profile: expected chat, agentic or demo, got 'code'" \
    "$train" gen-data --profile code --out-dir "$tmp/g"
if TRAIN="$train" bash scripts/repro/layout_walltime.sh --tiny --layouts "npass duplicate" \
    --conversations 16 --steps 2 --runs "$tmp/runs" > "$tmp/out" 2>&1; then ok
else bad "layout_walltime.sh --tiny: $(tail -5 "$tmp/out")"; fi
md="$tmp/runs/LAYOUT_WALLTIME.md"
row() { grep "^| $1 |" "$md" | tr -d ' ' | tr '|' ' '; }
read -r _ n_tok n_tr n_time n_tps n_eq _ n_rt n_rtime n_rr < <(row npass) || true
read -r _ d_tok d_tr d_time d_tps d_eq _ d_rt d_rtime d_rr < <(row duplicate) || true
if [ "${n_rt:-}" = 1.000 ] && [ "${n_rtime:-}" = 1.000 ] && [ "${n_rr:-}" = 1.000 ]; then ok
else bad "npass ratios: $(row npass)"; fi
if [ -n "${n_eq:-}" ] && [ "$n_eq" = "$n_tps" ] && [ "${n_tok:-0}" -gt 0 ]; then ok
else bad "npass: npass-eq tokens/s is its tokens/s: $(row npass)"; fi
if awk -v r="${d_rt:-x}" 'BEGIN { exit !(r + 0 > 0.3 && r + 0 < 1) }'; then ok
else bad "duplicate processes fewer tokens than npass: $(row duplicate)"; fi
if [ "${d_tr:-0}" -gt 0 ] && awk -v t="${d_time:-0}" 'BEGIN { exit !(t > 0) }'; then ok
else bad "duplicate trained and timed: $(row duplicate)"; fi
cp "$tmp/runs/npass.log" "$tmp/npass.log.before"
if TRAIN=/nonexistent bash scripts/repro/layout_walltime.sh --tiny --layouts "npass duplicate" \
    --conversations 16 --steps 2 --runs "$tmp/runs" --md "$tmp/again.md" --table-only > "$tmp/out2" 2>&1 &&
    diff "$md" "$tmp/again.md" >&2 && cmp -s "$tmp/runs/npass.log" "$tmp/npass.log.before"; then ok
else bad "--table-only: the same table, nothing trained: $(tail -3 "$tmp/out2")"; fi
finish
