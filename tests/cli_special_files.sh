#!/usr/bin/env bash
# Every file onepass reads or copies from a model folder (config.json,
# model.safetensors.index.json, generation_config.json, the tokenizer files) is checked as
# a regular file of bounded size when the folder is taken: a FIFO, a device (a symbolic
# link to /dev/zero) or a directory under such a name is refused by name at once, before
# anything waits on it, trains or copies it; a regular file over its limit is refused by
# its size. Each command runs under a timeout: a hang fails the test.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_data
export OMP_NUM_THREADS=2
small=(--set backend=cpu --set train.tokens_per_step=1024 --set train.micro_rows=1
       --set train.warmup_steps=1 --set eval.every=0 --set data.seq_len=1024 --set train.steps=1)

# A model folder holding everything: the committed sharded Qwen3 fixture, a tokenizer.
fresh() {
    rm -rf "$tmp/m" "$tmp/out"
    mkdir -p "$tmp/m"
    cp tests/data/hf/qwen3_qknorm_sharded/* "$tmp/m/"
    cp "$data/tokenizer.model" "$tmp/m/"
    echo '{}' > "$tmp/m/tokenizer_config.json"
}
# refused <description> <pattern> <command...>: exit 1 within the timeout, the message, no out_dir.
refused() {
    local what="$1" pattern="$2"; shift 2
    out=$(timeout 15 "$@" 2>&1 </dev/null); local rc=$?
    if [ "$rc" -ne 1 ]; then bad "$what: exit $rc (124: hung): $(tail -2 <<<"$out")"; return; fi
    grep -q -- "$pattern" <<<"$out" && ok || bad "$what: got: $(tail -2 <<<"$out")"
    [ ! -e "$tmp/out/checkpoint-000001" ] && ok || bad "$what: a checkpoint was written"
}
run=("$train" --set model.init_from="$tmp/m" --set data.tokenizer="$tmp/m" --set out_dir="$tmp/out" "${small[@]}")

for name in config.json model.safetensors.index.json tokenizer_config.json generation_config.json \
            merges.txt vocab.json chat_template.jinja special_tokens_map.json; do
    fresh; rm -f "$tmp/m/$name"; mkfifo "$tmp/m/$name"
    refused "$name a FIFO" "m/$name: not a regular file" "${run[@]}"
done
fresh; rm -f "$tmp/m/tokenizer_config.json"; mkdir "$tmp/m/tokenizer_config.json"
refused "tokenizer_config.json a directory" "m/tokenizer_config.json: not a regular file" "${run[@]}"
for name in vocab.json merges.txt added_tokens.json; do
    fresh; ln -s /dev/zero "$tmp/m/$name"
    refused "$name a link to /dev/zero" "m/$name: not a regular file" "${run[@]}"
done
# A regular file over its limit (sparse: no disk), refused by its size before it is read.
fresh; truncate -s 2G "$tmp/m/merges.txt"
refused "a 2 GiB merges.txt" "m/merges.txt: 2147483648 bytes, over the limit of 1073741824" "${run[@]}"
fresh; truncate -s 100M "$tmp/m/config.json"
refused "a 100 MB config.json" "m/config.json: 104857600 bytes, over the limit of 67108864" "${run[@]}"

# train export --from the folder checks it the same way.
fresh; rm -f "$tmp/m/tokenizer_config.json"; mkfifo "$tmp/m/tokenizer_config.json"
refused "export --from a folder with a FIFO" "m/tokenizer_config.json: not a regular file" \
    "$train" export --from "$tmp/m" --out "$tmp/exported"
[ ! -e "$tmp/exported" ] && ok || bad "a refused export wrote its --out"

# The folder intact trains and its checkpoint carries the tokenizer files.
fresh
if out=$(timeout 120 "$train" --set model.init_from="$tmp/m" --set data.tokenizer="$tmp/m" \
        --set out_dir="$tmp/out" "${small[@]}" 2>&1); then ok; else bad "intact folder: $(tail -2 <<<"$out")"; fi
for f in tokenizer.model tokenizer_config.json; do
    cmp -s "$tmp/m/$f" "$tmp/out/checkpoint-000001/$f" && ok || bad "checkpoint lacks $f"
done
finish
