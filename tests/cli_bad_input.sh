#!/usr/bin/env bash
# `train gen-data`, `train tokenizer` and `train pack` on good and bad JSONL:
# bad lines fail with a non-zero exit and "file:line: field: what"; --skip-bad
# skips them; gen-data and tokenizer reproduce the shipped files.
source "$(dirname "$0")/lib_cli.sh" "$1"
fixtures=tests/data; shipped=datasets/synthetic

# gen-data: same seed, same bytes; another seed, other bytes; the asked sizes.
for run in a b; do "$train" gen-data --out-dir "$tmp/$run" --seed 7 --train 20 --eval 5 --shared 4 >/dev/null || bad "gen-data $run"; done
"$train" gen-data --out-dir "$tmp/c" --seed 8 --train 20 --eval 5 --shared 4 >/dev/null || bad "gen-data c"
for f in train.jsonl eval.jsonl shared_prefix.jsonl; do
    if cmp -s "$tmp/a/$f" "$tmp/b/$f"; then ok; else bad "gen-data $f differs for one seed"; fi
    if ! cmp -s "$tmp/a/$f" "$tmp/c/$f"; then ok; else bad "gen-data $f equal for seeds 7 and 8"; fi
done
if [ "$(wc -l < "$tmp/a/train.jsonl")" -eq 20 ] && [ "$(wc -l < "$tmp/a/eval.jsonl")" -eq 5 ] &&
   [ "$(wc -l < "$tmp/a/shared_prefix.jsonl")" -eq 4 ]; then ok; else bad "gen-data sizes"; fi
expect_error "gen-data without --out-dir" "out-dir" "$train" gen-data --seed 1
expect_error "gen-data bad count" "--train: expected a non-negative integer, got 'many'" "$train" gen-data --out-dir "$tmp/x" --train many
expect_error "gen-data unknown flag" "unknown argument '--bogus'" "$train" gen-data --out-dir "$tmp/x" --bogus 1

# The shipped data and tokenizer are what the README commands make.
if [ -f "$shipped/train.jsonl" ] && [ -f "$shipped/tokenizer.vocab" ]; then
    "$train" gen-data --out-dir "$tmp/shipped" --seed 1234 --train 2000 --eval 200 --shared 200 >/dev/null
    for f in train.jsonl eval.jsonl shared_prefix.jsonl; do
        if cmp -s "$tmp/shipped/$f" "$shipped/$f"; then ok; else bad "$shipped/$f is not what gen-data writes"; fi
    done
    # The .model records its own path, so compare the vocabularies (pieces and scores).
    if "$train" tokenizer --corpus-from "$shipped/train.jsonl" --out "$tmp/tok" --vocab-size 512 >/dev/null &&
       cmp -s "$tmp/tok.vocab" "$shipped/tokenizer.vocab"; then ok; else bad "retrained tokenizer differs from $shipped"; fi
    [ ! -e "$tmp/tok.corpus.txt" ] && ok || bad "tokenizer left its corpus file behind"
else
    bad "$shipped not generated"
fi

# tokenizer: all formats train; bad lines are fatal with file:line; usage errors.
if "$train" tokenizer --corpus-from "$fixtures/all_formats.jsonl" --out "$tmp/small" --vocab-size 300 >/dev/null 2>&1 &&
   [ -s "$tmp/small.model" ]; then ok; else bad "tokenizer on all_formats.jsonl"; fi
expect_error "tokenizer bad role" "bad_role.jsonl:4: messages\[1\].role: unknown role 'robot'" \
    "$train" tokenizer --corpus-from "$fixtures/bad_role.jsonl" --out "$tmp/t"
expect_error "tokenizer missing file" "nope.jsonl: cannot open" "$train" tokenizer --corpus-from "$tmp/nope.jsonl" --out "$tmp/t"
expect_error "tokenizer without --out" "usage: train tokenizer" "$train" tokenizer --corpus-from "$fixtures/all_formats.jsonl"
expect_error "tokenizer bad vocab size" "vocab-size" "$train" tokenizer --corpus-from "$fixtures/all_formats.jsonl" --out "$tmp/t" --vocab-size x

# pack: each bad fixture fails naming file:line and the field; --skip-bad skips it.
pack() { "$train" pack --set data.tokenizer="$shipped/tokenizer.model" "$@"; }
while IFS='|' read -r file pattern; do
    expect_error "pack $file" "$file:$pattern" pack --set data.train_path="$fixtures/$file" --out "$tmp/rows.jsonl"
    if out=$(pack --set data.train_path="$fixtures/$file" --out "$tmp/rows.jsonl" --skip-bad 2>&1) &&
       grep -q "^skipped *1 bad" <<<"$out"; then ok; else bad "pack --skip-bad $file: $out"; fi
done <<'EOF'
bad_role.jsonl|4: messages\[1\].role: unknown role 'robot'
bad_utf8.jsonl|2: invalid UTF-8
bad_think.jsonl|2: conversations\[1\].value: unclosed think tag
bad_unknown_key.jsonl|2: messages\[1\]\.foo: unknown key
bad_part_type.jsonl|2: messages\[0\]\.content\[1\]\.type: "image_url" is not supported
bad_preference.jsonl|2: chosen: preference pairs
bad_thinking_twice.jsonl|2: messages\[1\]: both reasoning_content and thinking, with different texts
bad_sharegpt_system.jsonl|2: system: given both at the top level and as conversations\[0\]
bad_tool_order.jsonl|2: messages\[2\]\.role: a tool result must follow an assistant message with tool_calls
bad_tool_arguments.jsonl|2: messages\[1\]\.tool_calls\[0\]\.function\.arguments: a string that is not valid JSON
bad_completion.jsonl|2: completion\[0\]\.role: expected 'assistant' or 'tool', got 'user'
EOF
expect_error "pack bad_completions" "bad_completions.jsonl:3: completions: empty completions list" \
    pack --set data.train_path="$fixtures/bad_completions.jsonl" --set data.layout=shared_prefix --out "$tmp/rows.jsonl"

# Every newer format (tool use, content parts, TRL prompt/completion, ShareGPT system,
# "thinking") packs under each conversation layout. Unknown keys are ignored under
# data.ignore_unknown_keys, with one line naming them; the loss options name their key.
for layout in npass mask_only duplicate; do
    if pack --set data.train_path="$fixtures/more_formats.jsonl" --set data.seq_len=2048 \
           --set data.layout=$layout --out "$tmp/rows.jsonl" >/dev/null 2>&1; then ok
    else bad "pack more_formats.jsonl under $layout failed"; fi
done
if out=$(pack --set data.train_path="$fixtures/bad_unknown_key.jsonl" --set data.ignore_unknown_keys=true \
             --out "$tmp/rows.jsonl" 2>&1) &&
   grep -q "bad_unknown_key.jsonl: 1 unknown key ignored (data.ignore_unknown_keys): messages\[\]\.foo (1)$" <<<"$out" &&
   grep -q "^conversations *2$" <<<"$out"; then ok; else bad "ignore_unknown_keys: $out"; fi
# Hub shapes (metadata keys, "developer", message "name", "reasoning") pack without
# data.ignore_unknown_keys under each layout, the metadata keys named in one line.
for layout in npass mask_only duplicate; do
    if out=$(pack --set data.train_path="$fixtures/hub_shapes.jsonl" --set data.seq_len=2048 \
                 --set data.layout=$layout --out "$tmp/rows.jsonl" 2>&1) &&
       grep -q "hub_shapes.jsonl: 14 metadata keys read, not rendered: source (1), .*messages\[\]\.name (2)" <<<"$out" &&
       grep -q "^conversations *4$" <<<"$out"; then ok; else bad "hub_shapes.jsonl under $layout: $out"; fi
done
trained() { grep -o "^trained tokens *[0-9]*" <<<"$1" | grep -o "[0-9]*$"; }
all=$(pack --set data.train_path="$fixtures/all_formats.jsonl" --set data.layout=npass --out "$tmp/rows.jsonl" 2>&1)
answers=$(pack --set data.train_path="$fixtures/all_formats.jsonl" --set data.layout=npass --set data.train_on=answer \
          --out "$tmp/rows.jsonl" 2>&1)
[ -n "$(trained "$answers")" ] && [ "$(trained "$answers")" -lt "$(trained "$all")" ] && ok \
    || bad "train_on=answer trains fewer tokens: $(trained "$answers") vs $(trained "$all")"
more=(--set data.train_path="$fixtures/more_formats.jsonl" --set data.seq_len=2048 --out "$tmp/rows.jsonl")
with=$(pack "${more[@]}" 2>&1); without=$(pack "${more[@]}" --set data.skip_empty_think_turns=true 2>&1)
[ -n "$(trained "$without")" ] && [ "$(trained "$without")" -lt "$(trained "$with")" ] && ok \
    || bad "skip_empty_think_turns trains fewer tokens: $(trained "$without") vs $(trained "$with")"
expect_error "pack train_on=all" "config key 'data.train_on': unknown value 'all'" \
    pack --set data.train_on=all --out "$tmp/rows.jsonl"
expect_error "pack max_line_bytes=-1" "config key 'data.max_line_bytes'" \
    pack --set data.max_line_bytes=-1 --out "$tmp/rows.jsonl"

# Template tokens spelled in text fields: plain text by default, refused with the field
# under data.special_in_text=error, any other value names the key.
if pack --set data.train_path="$fixtures/special_in_text.jsonl" --out "$tmp/rows.jsonl" >/dev/null 2>&1; then ok
else bad "pack special_in_text.jsonl (plain) failed"; fi
expect_error "pack special_in_text=error" \
    "special_in_text.jsonl:2: messages\[0\].content: contains the template token '<|assistant|>'" \
    pack --set data.train_path="$fixtures/special_in_text.jsonl" --set data.special_in_text=error --out "$tmp/rows.jsonl"
expect_error "pack special_in_text=drop" "config key 'data.special_in_text': unknown value 'drop'" \
    pack --set data.special_in_text=drop --out "$tmp/rows.jsonl"

# data.tokenizer takes a model folder (tokenizer.json, else tokenizer.model); one that
# lacks the template's tokens is refused naming the token.
for tok in qwen2 llama3 sp_dummy; do
    if "$train" pack --set data.tokenizer=tests/data/tokenizers/$tok --set data.train_path="$shipped/eval.jsonl" \
           --out "$tmp/rows.jsonl" >/dev/null 2>&1; then ok; else bad "pack with the $tok tokenizer folder failed"; fi
done
expect_error "pack with gpt2 (no template tokens)" "no id for the template token '<|system|>'" \
    "$train" pack --set data.tokenizer=tests/data/tokenizers/gpt2 --out "$tmp/rows.jsonl"
expect_error "pack with an empty folder" "neither tokenizer.json nor tokenizer.model" \
    "$train" pack --set data.tokenizer="$tmp" --out "$tmp/rows.jsonl"

# Non-regular inputs are refused by name; no C++ exception escapes (exit 134).
expect_exit1() {  # expect_exit1 <description> <pattern> <command...>: exit status 1 and the message
    local what="$1" pattern="$2"; shift 2
    out=$("$@" 2>&1); local rc=$?
    if [ "$rc" -ne 1 ]; then bad "$what: exit $rc: $out"; return; fi
    if grep -q -- "$pattern" <<<"$out"; then ok; else bad "$what: got: $out"; fi
}
mkdir -p "$tmp/dir"; mkfifo "$tmp/fifo"
expect_exit1 "tokenizer is a FIFO" "$tmp/fifo: not a regular file" pack --set data.tokenizer="$tmp/fifo" --out "$tmp/rows.jsonl"
head -c 3000 /dev/urandom > "$tmp/garbage.model"
expect_exit1 "tokenizer is garbage" "garbage.model: " pack --set data.tokenizer="$tmp/garbage.model" --out "$tmp/rows.jsonl"
expect_exit1 "train data is a directory" "$tmp/dir: not a regular file" pack --set data.train_path="$tmp/dir" --out "$tmp/rows.jsonl"
expect_exit1 "train data is a FIFO" "$tmp/fifo: not a regular file" pack --set data.train_path="$tmp/fifo" --out "$tmp/rows.jsonl"
{ printf '\xef\xbb\xbf'; head -n 2 "$shipped/train.jsonl"; } > "$tmp/bom.jsonl"
expect_exit1 "a JSONL file with a BOM" "bom.jsonl:1: starts with a UTF-8 byte order mark" pack --set data.train_path="$tmp/bom.jsonl" --out "$tmp/rows.jsonl"
expect_exit1 "tokenizer --corpus-from a directory" "$tmp/dir: not a regular file" "$train" tokenizer --corpus-from "$tmp/dir" --out "$tmp/t"

finish
