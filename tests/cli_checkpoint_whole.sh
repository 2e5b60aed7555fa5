#!/usr/bin/env bash
# A checkpoint is installed whole or not at all: every file (weights, optimizer state,
# config, the tokenizer files and their added tokens) is written into checkpoint-N.tmp/
# before the rename. A save that fails part-way (a file-size limit stands in for the full
# disk) leaves no checkpoint-N.tmp and no checkpoint-N, and an older checkpoint-N of the
# same step as it was. Export and resume refuse a checkpoint missing a file its
# optimizer state lists, naming the checkpoint and the file.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_data
export OMP_NUM_THREADS=2
small=(--set backend=cpu --set train.tokens_per_step=1024 --set train.micro_rows=1
       --set train.warmup_steps=1 --set eval.every=0 --set data.seq_len=1024 --set train.steps=1)
mkdir -p "$tmp/m"
cp tests/data/hf/qwen3_qknorm_sharded/* "$tmp/m/"
cp "$data/tokenizer.model" "$tmp/m/"
run=("$train" --set model.init_from="$tmp/m" --set data.tokenizer="$tmp/m" --set out_dir="$tmp/out" "${small[@]}")
ck="$tmp/out/checkpoint-000001"

# A whole save, kept aside to compare with.
if out=$("${run[@]}" 2>&1); then ok; else bad "first run: $(tail -2 <<<"$out")"; fi
cp -r "$ck" "$tmp/before"

# merges.txt (copied, never read) is 5 MB; each file may grow to 4 MB: the save fails
# while copying it, after the weights and tokenizer.model were written.
head -c 5000000 /dev/zero | tr '\0' a > "$tmp/m/merges.txt"
limited() { (ulimit -f 4096; trap '' XFSZ; "$@"); }
if out=$(limited "${run[@]}" --set train.overwrite=true 2>&1); then
    bad "a save over the file-size limit: exit 0"
else
    grep -q "writing checkpoint: .*merges.txt" <<<"$out" && ok || bad "failed save message: $(tail -2 <<<"$out")"
fi
[ ! -e "$ck.tmp" ] && ok || bad "a failed save left $ck.tmp"
[ ! -e "$ck.old" ] && ok || bad "a failed save left $ck.old"
diff -r "$tmp/before" "$ck" >/dev/null && ok || bad "a failed save changed the older $ck"
rm -rf "$tmp/out"
if out=$(limited "${run[@]}" 2>&1); then bad "a failed first save: exit 0"; fi
[ ! -e "$ck" ] && [ ! -e "$ck.tmp" ] && ok || bad "a failed first save left $(ls "$tmp/out")"
rm -f "$tmp/m/merges.txt"

# The same checkpoint with a file removed: export and resume name it.
rm -rf "$tmp/out"; cp -r "$tmp/before" "$tmp/broken"; rm "$tmp/broken/tokenizer.model"
expect_error "export of an incomplete checkpoint" "broken: incomplete checkpoint: tokenizer.model is missing" \
    "$train" export --from "$tmp/broken" --out "$tmp/exported"
[ ! -e "$tmp/exported" ] && ok || bad "a refused export wrote its --out"
expect_error "resume of an incomplete checkpoint" "broken: incomplete checkpoint: tokenizer.model is missing" \
    "${run[@]}" --set train.steps=2 --set train.resume="$tmp/broken"
# Whole, both work.
if out=$("$train" export --from "$tmp/before" --out "$tmp/exported" 2>&1) && [ -f "$tmp/exported/tokenizer.model" ]; then ok; else bad "export: $(tail -2 <<<"$out")"; fi
finish
