#!/usr/bin/env bash
# Output paths: a regular file is replaced atomically, anything else
# is written in place (a FIFO stays a FIFO, /dev/null stays a device), a symbolic link
# keeps being a link, and an output that is an input (by device and inode) is refused.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_data
head -n 3 "$data/train.jsonl" > "$tmp/conv.jsonl"
cp "$tmp/conv.jsonl" "$tmp/conv.orig"
pack() { "$train" pack --set data.tokenizer="$data/tokenizer.model" --set data.train_path="$tmp/conv.jsonl" "$@"; }

# A device (/dev/null): written in place, never renamed over. As root a regression would
# replace the machine's /dev/null, so root tests a twin of it made in $tmp.
null=/dev/null
if [ "$(id -u)" -eq 0 ] && mknod -m 666 "$tmp/null" c 1 3 2>/dev/null; then null="$tmp/null"; fi
if out=$(pack --out "$null" 2>&1) && [ -c "$null" ]; then ok; else bad "--out $null: $out"; fi
# A FIFO: its reader gets the rows, and it is still a FIFO afterwards (a regression
# that renames over it leaves the reader waiting: the timeouts end it).
mkfifo "$tmp/fifo"
timeout 30 cat "$tmp/fifo" > "$tmp/from_fifo" & reader=$!
if out=$(timeout 30 "$train" pack --set data.tokenizer="$data/tokenizer.model" --set data.train_path="$tmp/conv.jsonl" --out "$tmp/fifo" 2>&1); then ok; else bad "--out FIFO: $out"; fi
wait "$reader"
if [ -p "$tmp/fifo" ]; then ok; else bad "the FIFO was replaced by a regular file"; fi
pack --out "$tmp/rows.jsonl" >/dev/null 2>&1
if cmp -s "$tmp/from_fifo" "$tmp/rows.jsonl"; then ok; else bad "the FIFO's reader did not get the rows"; fi
# A symbolic link: the target is rewritten, the link stays a link.
echo old > "$tmp/target.jsonl"; ln -s target.jsonl "$tmp/link.jsonl"
if out=$(pack --out "$tmp/link.jsonl" 2>&1) && [ -L "$tmp/link.jsonl" ] &&
   cmp -s "$tmp/target.jsonl" "$tmp/rows.jsonl"; then ok; else bad "--out symlink: $out"; fi
# The input as output, by name, through a hard link and through a symbolic link.
ln "$tmp/conv.jsonl" "$tmp/hard.jsonl"; ln -s conv.jsonl "$tmp/soft.jsonl"
for o in conv.jsonl hard.jsonl soft.jsonl; do
    if out=$(pack --out "$tmp/$o" 2>&1); then bad "--out $o (the input): exit 0"
    elif grep -q "$o: refusing to overwrite an input of this run" <<<"$out"; then ok; else bad "--out $o: $out"; fi
done
if cmp -s "$tmp/conv.jsonl" "$tmp/conv.orig"; then ok; else bad "the data set was overwritten"; fi
# The tokenizer or the config file as output.
echo '{}' > "$tmp/config.json"
if out=$(pack --config "$tmp/config.json" --out "$tmp/config.json" 2>&1); then bad "--out config: exit 0"
elif grep -q "refusing to overwrite an input" <<<"$out"; then ok; else bad "--out config: $out"; fi
cp "$data/tokenizer.model" "$tmp/tok.model"
if out=$(pack --set data.tokenizer="$tmp/tok.model" --out "$tmp/tok.model" 2>&1); then bad "--out tokenizer: exit 0"
elif grep -q "refusing to overwrite an input" <<<"$out" && cmp -s "$tmp/tok.model" "$data/tokenizer.model"; then ok; else bad "--out tokenizer: $out"; fi
# A directory as output.
if out=$(pack --out "$tmp" 2>&1); then bad "--out dir: exit 0"
elif grep -q "$tmp: is a directory" <<<"$out"; then ok; else bad "--out dir: $out"; fi
# train tokenizer: SentencePiece's PREFIX.model may not be the corpus it reads.
cp "$tmp/conv.orig" "$tmp/corpus.model"
if out=$("$train" tokenizer --corpus-from "$tmp/corpus.model" --out "$tmp/corpus" --vocab-size 300 2>&1); then bad "tokenizer over its corpus: exit 0"
elif grep -q "corpus.model: refusing to overwrite an input" <<<"$out" && cmp -s "$tmp/corpus.model" "$tmp/conv.orig"; then ok; else bad "tokenizer over its corpus: $out"; fi
# parity --json and gen-data follow the same rule.
if out=$("$train" gen-data --out-dir "$tmp/gen" --train 2 --eval 1 --shared 1 2>&1) && [ -s "$tmp/gen/train.jsonl" ] &&
   ! ls "$tmp/gen"/*.tmp* >/dev/null 2>&1; then ok; else bad "gen-data: $out"; fi

finish
