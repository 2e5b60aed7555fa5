#!/usr/bin/env bash
# Memory that the input decides is bounded: huge sizes are refused naming the key
# before anything is allocated (for every rank on the machine), a JSONL line whose text cannot fit data.seq_len is
# refused before it is tokenized, one longer than data.max_line_bytes before its JSON is
# parsed, and training memory grows by a bounded multiple of the train file's bytes.
source "$(dirname "$0")/lib_cli.sh" "$1"
need_data
expect_error "tokens_per_step 1e15" "config key 'train.tokens_per_step': must be in" \
    "$train" --set out_dir="$tmp/a" --set train.tokens_per_step=1000000000000000
expect_error "a model larger than the machine" "config keys model.hidden_size.*more than this machine" \
    "$train" --set out_dir="$tmp/b" --set model.hidden_size=65536 --set model.intermediate_size=262144 \
    --set model.num_hidden_layers=1024 --set model.num_attention_heads=512 --set model.num_key_value_heads=512
expect_error "micro-batches larger than the machine" "config keys train.micro_rows x data.seq_len.*with train.recompute mlp.*or set train.recompute=layer" \
    "$train" --set out_dir="$tmp/c" --set train.micro_rows=65536 --set data.seq_len=1048576 --set backend=cpu
expect_error "micro-batches larger than the machine, recompute layer" "with train.recompute layer.*(lower train.micro_rows)" \
    "$train" --set out_dir="$tmp/c" --set train.micro_rows=65536 --set data.seq_len=1048576 --set backend=cpu \
    --set train.recompute=layer
# A model of about a sixteenth of the machine's memory (16 bytes a parameter on the cpu
# backend, 16.8M parameters a layer at hidden 1024) fits one rank but not 64 ranks of this
# machine, each holding all of it: refused before connecting to the others (no wait).
layers=$(awk '/^MemTotal:/ { l = int($2 * 1024 / 16 / (16 * 16779264)); print (l < 1 ? 1 : l) }' /proc/meminfo)
expect_error "64 ranks on this machine" "more than [0-9.]* GiB, this machine's [0-9.]* GiB shared by its 64 ranks" \
    env RANK=0 WORLD_SIZE=64 LOCAL_RANK=0 LOCAL_WORLD_SIZE=64 MASTER_ADDR=127.0.0.1 MASTER_PORT=29871 \
    timeout 60 "$train" --set out_dir="$tmp/d" --set backend=cpu --set model.hidden_size=1024 \
    --set model.intermediate_size=4096 --set model.num_attention_heads=8 \
    --set model.num_key_value_heads=8 --set model.num_hidden_layers="$layers"
[ ! -e "$tmp/a" ] && [ ! -e "$tmp/b" ] && [ ! -e "$tmp/c" ] && [ ! -e "$tmp/d" ] && ok || bad "a refused run created its out_dir"

# A 10 MB user message with data.seq_len 64: refused naming the line and data.max_line_bytes
# (default 64 x seq_len, at least 1 MiB) before its JSON is parsed: ~2 MB above start-up,
# where parsing it costs ~10 MB more.
{ printf '{"messages": [{"role": "user", "content": "'; head -c 10000000 /dev/zero | tr '\0' x
  printf '"}, {"role": "assistant", "content": "ok"}]}\n'; } > "$tmp/big.jsonl"
head -n 2 "$data/train.jsonl" >> "$tmp/big.jsonl"
big_bytes=$(( $(head -n 1 "$tmp/big.jsonl" | wc -c) - 1 ))
# Memory is measured above the binary's own start-up (a CUDA build maps and touches its
# CUDA libraries before main: ~200 MB resident): GNU time's peak resident KB of a run.
timed() { /usr/bin/time -f 'maxrss_kb %M' "$@"; }
maxrss() { grep -o 'maxrss_kb [0-9]*' <<<"$1" | grep -o '[0-9]*$'; }
base_rss=$(maxrss "$(timed "$train" --help 2>&1 >/dev/null)")
pack_big=(pack --set data.tokenizer="$data/tokenizer.model" --set data.train_path="$tmp/big.jsonl")
pack() { "$train" "${pack_big[@]}" "$@"; }
if out=$(timed "$train" "${pack_big[@]}" --set data.seq_len=64 --out "$tmp/rows.jsonl" 2>&1); then
    bad "10 MB line: exit 0"
else
    grep -q "big.jsonl:1: the line is $big_bytes bytes, over data.max_line_bytes 1048576: not parsed" <<<"$out" \
        && ok || bad "10 MB line message: $(tail -2 <<<"$out")"
    rss=$(maxrss "$out")
    [ -n "$rss" ] && [ $((rss - base_rss)) -lt 6000 ] && ok || bad "10 MB line took ${rss} KB, ${base_rss} KB at start-up (parsed?)"
fi
# The limit is the key's: a line of exactly the limit is parsed (below), one byte over is not.
if out=$(pack --set data.seq_len=64 --set data.max_line_bytes=$((big_bytes - 1)) --out "$tmp/rows.jsonl" 2>&1); then
    bad "line over an explicit limit: exit 0"
else
    grep -q "big.jsonl:1: the line is $big_bytes bytes, over data.max_line_bytes $((big_bytes - 1))" <<<"$out" \
        && ok || bad "explicit limit: $(tail -2 <<<"$out")"
fi
# Under a limit that lets it through, the text check after the parse refuses it, before
# tokenizing.
if out=$(timed "$train" "${pack_big[@]}" --set data.seq_len=64 --set data.max_line_bytes=$big_bytes \
         --out "$tmp/rows.jsonl" 2>&1); then
    bad "10 MB line under its limit: exit 0"
else
    grep -q "big.jsonl:1: a document of at least [0-9]* tokens (10000002 bytes of text) does not fit seq_len 64" <<<"$out" \
        && ok || bad "10 MB line text message: $(tail -2 <<<"$out")"
    rss=$(maxrss "$out")
    [ -n "$rss" ] && [ $((rss - base_rss)) -lt 1000000 ] && ok || bad "10 MB line took ${rss} KB, ${base_rss} KB at start-up (tokenized?)"
fi
if out=$(pack --set data.seq_len=1024 --set data.skip_too_long=true --out "$tmp/rows.jsonl" 2>&1) &&
   grep -q "^skipped *0 bad, 1 too long" <<<"$out"; then ok; else bad "skip_too_long of the line: $out"; fi

# A line under 1 MiB of 16,000 empty turns: no text, but 3 template tokens a turn (onepass:
# <|user|>, <|assistant|>, <|end|>), so its last view is 48,000 tokens. The check before
# tokenizing counts them; npass's 16,000 views (~3T^2/2 tokens) are never built.
python3 -c 'import sys; t = "{\"role\":\"user\",\"content\":\"\"},{\"role\":\"assistant\",\"content\":\"\"}"
sys.stdout.write("{\"messages\":[" + ",".join([t] * 16000) + "]}\n")' > "$tmp/empty_turns.jsonl"
head -n 2 "$data/train.jsonl" >> "$tmp/empty_turns.jsonl"
[ "$(head -n 1 "$tmp/empty_turns.jsonl" | wc -c)" -lt 1048576 ] && ok || bad "the empty-turns line is over 1 MiB"
pack_empty=(pack --set data.tokenizer="$data/tokenizer.model" --set data.train_path="$tmp/empty_turns.jsonl"
            --set data.layout=npass --out "$tmp/rows.jsonl")
if out=$(timed "$train" "${pack_empty[@]}" --set data.seq_len=1024 2>&1); then
    bad "16,000 empty turns: exit 0"
else
    grep -q "empty_turns.jsonl:1: a document of at least 48000 tokens (0 bytes of text) does not fit seq_len 1024" <<<"$out" \
        && ok || bad "16,000 empty turns message: $(tail -2 <<<"$out")"
    rss=$(maxrss "$out")
    [ -n "$rss" ] && [ $((rss - base_rss)) -lt 100000 ] && ok || bad "16,000 empty turns took ${rss} KB, ${base_rss} KB at start-up"
fi
if out=$("$train" "${pack_empty[@]}" --set data.seq_len=1024 --set data.skip_too_long=true 2>&1) &&
   grep -q "^skipped *0 bad, 1 too long" <<<"$out" && [ "$(wc -l < "$tmp/rows.jsonl")" -ge 1 ]; then ok
else bad "skip_too_long of the empty turns: $out"; fi
# 2,000 turns of a short question fit the bound before tokenizing at seq_len 16384 but not
# once tokenized: refused by each layout's longest document, counted before any is built
# (npass would build ~40 million tokens of views first: 20,000 tokens each).
python3 -c 't = "{\"role\":\"user\",\"content\":\"1 2 3 4 5 6 7 8 9\"},{\"role\":\"assistant\",\"content\":\"\"}"
print("{\"messages\":[" + ",".join([t] * 2000) + "]}")' > "$tmp/short_turns.jsonl"
for layout in npass mask_only duplicate; do
    if out=$(timed "$train" pack --set data.tokenizer="$data/tokenizer.model" --set data.train_path="$tmp/short_turns.jsonl" \
             --set data.layout=$layout --set data.seq_len=16384 --out "$tmp/rows.jsonl" 2>&1); then
        bad "2,000 short turns ($layout): exit 0"
    else
        grep -q "short_turns.jsonl:1: a document of [0-9]* tokens does not fit seq_len 16384" <<<"$out" \
            && ok || bad "2,000 short turns ($layout) message: $(tail -2 <<<"$out")"
        rss=$(maxrss "$out")
        [ -n "$rss" ] && [ $((rss - base_rss)) -lt 100000 ] && ok || bad "2,000 short turns ($layout) took ${rss} KB, ${base_rss} KB at start-up"
    fi
done
# A model folder's config.json keeps the ranges of the model.* keys: 2^30 layers are
# refused by the key's limit at once, before a parameter table of them is built.
mkdir -p "$tmp/deep"
cp tests/data/hf/llama3_scaling/* "$tmp/deep/"
sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1073741824/' "$tmp/deep/config.json"
expect_error "config.json with 2^30 layers" \
    "deep/config.json: 'num_hidden_layers' must be an integer in \[1, 1024\], got 1073741824" \
    timeout 5 "$train" --set out_dir="$tmp/d" --set model.init_from="$tmp/deep" \
    --set data.tokenizer="$data/tokenizer.model"
sed -i 's/"num_hidden_layers": 1073741824/"num_hidden_layers": 2/; s/"rope_theta": 500000.0/"rope_theta": 1e39/' \
    "$tmp/deep/config.json"
expect_error "config.json with rope_theta 1e39" "'rope_theta' must be a number in (0, 1e+12\], got 1e+39" \
    "$train" --set out_dir="$tmp/d" --set model.init_from="$tmp/deep" --set data.tokenizer="$data/tokenizer.model"
[ ! -e "$tmp/d" ] && ok || bad "a refused config.json created out_dir"

# Training memory grows with the train file by a bounded multiple: the peak resident memory
# of one step on the shipped data and on it three times over (duplicate layout) differs by
# less than 48 bytes per added byte of JSONL (about 35 measured).
for k in 1 3; do
    for i in $(seq $k); do cat "$data/train.jsonl"; done > "$tmp/train$k.jsonl"
    out=$(timed "$train" --set data.train_path="$tmp/train$k.jsonl" --set out_dir="$tmp/mem$k" \
          --set train.steps=1 --set eval.every=0 --set train.checkpoint_every=0 2>&1) || bad "train on ${k}x: $(tail -2 <<<"$out")"
    declare "rss$k=$(maxrss "$out")"
done
added=$(( $(wc -c < "$tmp/train3.jsonl") - $(wc -c < "$tmp/train1.jsonl") ))
per_byte=$(( (rss3 - rss1) * 1024 / added ))
echo "training memory: $per_byte bytes per byte of JSONL"
if ldd "$train" 2>/dev/null | grep -q libasan; then
    echo "note: AddressSanitizer build (its redzones and quarantine change the multiple): not compared"; ok
else [ "$per_byte" -lt 48 ] && ok || bad "training memory grew $per_byte bytes per byte of JSONL (${rss1} KB -> ${rss3} KB)"; fi
finish
