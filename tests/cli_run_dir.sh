#!/usr/bin/env bash
# The run directory: a run into a non-empty out_dir that is not
# a resume of it is refused unless train.overwrite=true; a refused run or resume leaves
# the directory as it was (the config is written after validation); checkpoints appear
# whole (checkpoint-N.tmp/ renamed); `train` with no arguments says what it does and
# never clobbers an existing run.
source "$(dirname "$0")/lib_cli.sh" "$1"
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=1
      --set eval.every=0 --set data.seq_len=1024 --set train.steps=2 --set seed=5)
export OMP_NUM_THREADS=2
run="$tmp/run"
"$train" --set out_dir="$run" "${tiny[@]}" > "$tmp/a.log" 2>&1 && ok || bad "first run: $(tail -3 "$tmp/a.log")"
cp "$run/run_config.json" "$tmp/config.saved"; cp "$run/metrics.jsonl" "$tmp/metrics.saved"
unchanged() { cmp -s "$run/run_config.json" "$tmp/config.saved" && cmp -s "$run/metrics.jsonl" "$tmp/metrics.saved"; }

expect_error "a new run into a used out_dir" "out_dir '$run' already holds a run.*train.overwrite=true" \
    "$train" --set out_dir="$run" "${tiny[@]}" --set train.lr=0.01
unchanged && ok || bad "a refused run changed the run's config or metrics"
expect_error "a refused resume (another shape)" "train.resume" \
    "$train" --set out_dir="$run" "${tiny[@]}" --set model.num_hidden_layers=3 --set train.resume="$run/checkpoint-000002"
unchanged && ok || bad "a refused resume changed the run's config or metrics"
expect_error "a bad value after the out_dir check" "train.resume" \
    "$train" --set out_dir="$run" "${tiny[@]}" --set train.resume="$tmp/nope"
unchanged && ok || bad "a refused resume (missing checkpoint) changed the run"
other="$tmp/other"; mkdir -p "$other"; echo keep > "$other/notes.txt"
expect_error "a resume into another non-empty directory" "out_dir '$other' already holds" \
    "$train" --set out_dir="$other" "${tiny[@]}" --set train.resume="$run/checkpoint-000002" --set train.steps=3
if ls -d "$run"/*.tmp "$run"/checkpoint-*.tmp >/dev/null 2>&1; then bad "temporary checkpoint left"; else ok; fi
[ -s "$run/checkpoint-000002/model.safetensors" ] && [ -s "$run/checkpoint-000002/optimizer.safetensors" ] && ok || bad "checkpoint files"
# A resume of the run in its own directory is allowed; overwrite=true replaces the run.
"$train" --set out_dir="$run" "${tiny[@]}" --set train.steps=3 --set train.resume="$run/checkpoint-000002" > "$tmp/b.log" 2>&1 \
    && ok || bad "resume in place: $(tail -3 "$tmp/b.log")"
# Resuming with the run's own run_config.json as --config: an input, so left as it is.
cp "$run/run_config.json" "$tmp/config.before"
if out=$("$train" --config "$run/run_config.json" --set train.steps=3 --set train.resume="$run/checkpoint-000003" 2>&1) &&
   grep -q "run_config.json is this run's --config file: left as it is" <<<"$out" && cmp -s "$run/run_config.json" "$tmp/config.before"
then ok; else bad "resume with --config out_dir/run_config.json: $(tail -2 <<<"$out")"; fi
"$train" --set out_dir="$run" "${tiny[@]}" --set train.overwrite=true > "$tmp/c.log" 2>&1 \
    && ok || bad "overwrite=true: $(tail -3 "$tmp/c.log")"
[ "$(wc -l < "$run/metrics.jsonl")" -eq 2 ] && ok || bad "overwrite: metrics has $(wc -l < "$run/metrics.jsonl") lines"
# Saving over an existing checkpoint directory (overwrite) leaves one whole checkpoint.
[ -s "$run/checkpoint-000002/model.safetensors" ] && ! ls -d "$run"/*.old "$run"/*.tmp >/dev/null 2>&1 && ok || bad "replaced checkpoint"

# `train run` with no arguments: says it trains the built-in defaults into runs/strip_thinking,
# and refuses when that directory holds a run (a bare `train` prints the help).
mkdir -p "$tmp/cwd/runs/strip_thinking"; echo '{"mine": 1}' > "$tmp/cwd/runs/strip_thinking/run_config.json"
out=$(cd "$tmp/cwd" && "$train" run 2>&1); rc=$?
[ "$rc" -ne 0 ] && ok || bad "bare train over an existing run: exit 0"
grep -q "no --config given: training the built-in defaults into out_dir 'runs/strip_thinking'" <<<"$out" && ok || bad "bare train message: $out"
grep -q "already holds a run" <<<"$out" && ok || bad "bare train refusal: $out"
[ "$(cat "$tmp/cwd/runs/strip_thinking/run_config.json")" = '{"mine": 1}' ] && ok || bad "bare train clobbered the run's config"

finish
