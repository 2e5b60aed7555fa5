#!/usr/bin/env bash
# A checkpoint carries the chat template it was trained with, as its official Jinja in
# chat_template.jinja (tokenizer_config.json keeps no other), whatever the source folder's
# own template and whatever the tokenizer kind. tests/data/export_template/*.json hold what
# transformers' apply_chat_template renders with such an export (made offline by
# scripts/fixtures/make_export_template_fixture.py): this test trains and exports the same
# way, checks that the export carries that Jinja byte for byte, and that onepass's own
# training views (npass rows, one document per view) have the ids of transformers'
# renders. The shipped Jinja texts (data/template_jinja.c) equal tests/data/templates/*.jinja.
source "$(dirname "$0")/lib_cli.sh"
need_data
command -v python3 >/dev/null || { echo "skip: needs python3"; exit 77; }
export OMP_NUM_THREADS=2
common=(--set backend=cpu --set train.steps=1 --set eval.every=0 --set data.seq_len=2048
        --set train.tokens_per_step=2048 --set train.micro_rows=1)
for fixture in tests/data/export_template/*.json; do
    name=$(basename "$fixture" .json)
    template=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["template"])' "$fixture")
    mapfile -t args < <(python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["args"]))' "$fixture")
    python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["chat_template_jinja"])' "$fixture" > "$tmp/$name.jinja"
    python3 -c 'import json,sys
for c in json.load(open(sys.argv[1]))["cases"]: print(c["line"])' "$fixture" > "$tmp/$name.jsonl"
    if "$train" "${common[@]}" "${args[@]}" --set out_dir="$tmp/$name" > "$tmp/$name.log" 2>&1 &&
       "$train" export --from "$tmp/$name/checkpoint-000001" --out "$tmp/$name.export" > /dev/null 2>&1
    then ok; else bad "$name: train and export: $(tail -2 "$tmp/$name.log")"; fi
    export="$tmp/$name.export"
    if cmp -s "$export/chat_template.jinja" "$tmp/$name.jinja" &&
       cmp -s "$export/chat_template.jinja" "tests/data/templates/$template.jinja"; then ok
    else bad "$name: the export's chat_template.jinja is not $template's official one"; fi
    if ! grep -q '"chat_template"' "$export/tokenizer_config.json"; then ok; else bad "$name: tokenizer_config.json keeps a chat_template"; fi
    # The template is read back from the export, and onepass's views are transformers' renders.
    if out=$("$train" pack --set data.tokenizer="$export" --set data.train_path="$tmp/$name.jsonl" \
        --set data.layout=npass --set data.unpacked=true --set data.seq_len=2048 --out "$tmp/$name.rows" 2>&1) &&
       grep -q "chat template $template\$" <<<"$out"; then ok; else bad "$name: pack from the export: $(tail -2 <<<"$out")"; fi
    if python3 - "$fixture" "$tmp/$name.rows" <<'PY'
import collections, json, sys
want = collections.Counter(tuple(v["ids"]) for c in json.load(open(sys.argv[1]))["cases"] for v in c["views"])
got = collections.Counter()
for line in open(sys.argv[2]):
    row = json.loads(line)
    docs = collections.defaultdict(list)
    for t, d in zip(row["tokens"], row["doc"]):
        if d >= 0: docs[d].append(t)
    got.update(tuple(v) for v in docs.values())
sys.exit(0 if got == want and sum(want.values()) > 0 else 1)
PY
    then ok; else bad "$name: onepass's views differ from transformers' renders of the export"; fi
done
# A SentencePiece run (the default model) carries onepass's template too.
if "$train" "${common[@]}" --set data.seq_len=1024 --set model.num_hidden_layers=1 --set out_dir="$tmp/sp" > "$tmp/sp.log" 2>&1 &&
   cmp -s "$tmp/sp/checkpoint-000001/chat_template.jinja" tests/data/templates/onepass.jinja
then ok; else bad "SentencePiece run: $(ls "$tmp/sp/checkpoint-000001" 2>&1)"; fi
if out=$("$train" pack --set data.tokenizer="$tmp/sp/checkpoint-000001" --set data.seq_len=1024 --out "$tmp/sp.rows" 2>&1) &&
   grep -q "chat template onepass\$" <<<"$out"; then ok; else bad "the SentencePiece checkpoint's template: $(tail -2 <<<"$out")"; fi
finish
