#!/usr/bin/env bash
# data.eval_path null: data.eval_holdout of the training file is held out (evenly spaced:
# the j-th of k at line (2j+1)n/(2k), computed here independently) and evaluated on; the
# run equals, metric for metric, a run on the other lines with the held-out lines as
# data.eval_path. Too small a file is refused; a synthetic eval set beside another
# training file is noted on the console.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
. "$(dirname "$0")/lib_metrics.sh"
head -n 40 "$data/train.jsonl" > "$tmp/train.jsonl"
# k = ceil(0.1 * 40) = 4 held out: lines (2j+1)*40/8 (0-based) = 5, 15, 25, 35.
awk 'BEGIN{n=40;k=4} {i=NR-1; held=0; for(j=0;j<k;j++) if (i==int((2*j+1)*n/(2*k))) held=1;
     print > (held ? "'"$tmp"'/held.jsonl" : "'"$tmp"'/rest.jsonl")}' "$tmp/train.jsonl"
tiny=(--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2
      --set train.tokens_per_step=1024 --set train.micro_rows=2 --set train.warmup_steps=1
      --set data.seq_len=1024 --set train.steps=4 --set eval.every=2 --set backend=cpu)
if "$train" "${tiny[@]}" --set data.train_path="$tmp/train.jsonl" --set data.eval_path=null \
    --set data.eval_holdout=0.1 --set out_dir="$tmp/held" > "$tmp/held.log" 2>&1; then ok; else bad "holdout run: $(tail -3 "$tmp/held.log")"; fi
if grep -q "^eval data: 4 of the 40 conversations of $tmp/train.jsonl held out of training (data.eval_holdout 0.1), 4 of them" "$tmp/held.log"
then ok; else bad "console: $(grep 'eval' "$tmp/held.log")"; fi
if grep -q "eval held out of data.train_path" "$tmp/held.log"; then ok; else bad "config line"; fi
if "$train" "${tiny[@]}" --set data.train_path="$tmp/rest.jsonl" --set data.eval_path="$tmp/held.jsonl" \
    --set out_dir="$tmp/split" > "$tmp/split.log" 2>&1; then ok; else bad "split run: $(tail -3 "$tmp/split.log")"; fi
if [ "$(grep -c eval_loss "$tmp/held/metrics.jsonl")" -eq 2 ] &&
   diff <(untimed "$tmp/held/metrics.jsonl") <(untimed "$tmp/split/metrics.jsonl") >&2; then ok
else bad "the holdout run differs from training on the rest and evaluating on the held-out lines"; fi
# A resume keeps the training set: switching between a held-out and a named eval set is refused.
expect_error "resume with an eval file" "held out of data.train_path: changed" \
    "$train" "${tiny[@]}" --set data.train_path="$tmp/train.jsonl" --set data.eval_path="$tmp/held.jsonl" \
    --set out_dir="$tmp/held" --set train.resume="$tmp/held/checkpoint-000004" --set train.steps=5
if out=$("$train" "${tiny[@]}" --set data.train_path="$tmp/train.jsonl" --set data.eval_path=null --set data.eval_holdout=0.1 \
    --set out_dir="$tmp/held" --set train.resume="$tmp/held/checkpoint-000004" --set train.steps=5 2>&1); then ok
else bad "resume with the same holdout: $(tail -2 <<<"$out")"; fi
expect_error "too few" "config key 'data.eval_holdout': $tmp/one.jsonl has 1 conversations, too few to hold 1 out" \
    bash -c "head -n 1 '$tmp/train.jsonl' > '$tmp/one.jsonl' && '$train' ${tiny[*]} --set data.train_path='$tmp/one.jsonl' --set data.eval_path=null --set out_dir='$tmp/x'"
if out=$("$train" "${tiny[@]}" --set train.steps=1 --set data.train_path="$tmp/rest.jsonl" --set out_dir="$tmp/note" 2>&1) &&
   grep -q "^note: the eval set is the synthetic datasets/synthetic/eval.jsonl while training on $tmp/rest.jsonl" <<<"$out"
then ok; else bad "no note: $(tail -3 <<<"$out")"; fi
finish
