#!/usr/bin/env bash
# Memory that the input decides is bounded: huge sizes are refused naming the key
# before anything is allocated, a JSONL line whose text cannot fit data.seq_len is
# refused before it is tokenized, and one longer than data.max_line_bytes before its
# JSON is parsed.
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
[ ! -e "$tmp/a" ] && [ ! -e "$tmp/b" ] && [ ! -e "$tmp/c" ] && ok || bad "a refused run created its out_dir"

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

finish
