#!/usr/bin/env bash
# The README's fine-tune command, taken from README.md and run as written (only the model
# folder replaced by the small folders of tests/data/hf_chat/, each with its own tokenizer
# and chat_template.jinja as transformers writes them), from a working directory that has
# the repository's configs/ and datasets/ and a ./train: it trains, a Ctrl-C (SIGINT) ends
# it with a checkpoint, and that checkpoint holds the folder's tokenizer and trained
# weights of the folder's shape. configs/finetune.json sets no model.* key.
source "$(dirname "$0")/lib_cli.sh"
need_data
export OMP_NUM_THREADS=2
root=$(pwd)

# The fenced block after "## Fine-tune a Hugging Face model", continuation lines joined.
command=$(awk '/^## Fine-tune a Hugging Face model/{s=1} s&&/^```bash/{b=1;next} b&&/^```/{exit} b' README.md |
          sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | tr -s ' ')
case "$command" in
  "./train --config configs/finetune.json --set model.init_from=/models/Qwen3-0.6B --set out_dir=runs/qwen3") ok ;;
  *) bad "the README's command is not the one this test knows: '$command'" ;;
esac
if grep -q '"model"' configs/finetune.json; then bad "configs/finetune.json sets model.* keys"; else ok; fi

work="$tmp/work"; mkdir -p "$work"
ln -s "$root/configs" "$work/configs"; ln -s "$root/datasets" "$work/datasets"
printf '#!/usr/bin/env bash\nexec "%s" "$@"\n' "$train" > "$work/train"; chmod +x "$work/train"
for family in qwen3 llama3; do
    folder="$root/tests/data/hf_chat/$family"
    run=${command//\/models\/Qwen3-0.6B/$folder}
    (cd "$work" && exec bash -c "$run") > "$tmp/$family.log" 2>&1 &
    pid=$!
    metrics="$work/runs/qwen3/metrics.jsonl"
    for _ in $(seq 600); do  # until step 2 is logged (at most 60 s)
        [ "$( { wc -l < "$metrics"; } 2>/dev/null || echo 0)" -ge 2 ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -INT "$pid" 2>/dev/null
    wait "$pid"; rc=$?
    if [ "$rc" -eq 0 ]; then ok; else bad "$family: exit $rc: $(tail -3 "$tmp/$family.log")"; fi
    ck=$(ls -d "$work"/runs/qwen3/checkpoint-* 2>/dev/null | tail -1)
    if [ -n "$ck" ] && cmp -s "$ck/tokenizer.json" "$folder/tokenizer.json" && [ ! -e "$ck/tokenizer.model" ]
    then ok; else bad "$family: checkpoint tokenizer: $(ls "$ck" 2>&1)"; fi
    if grep -q "\"hidden_size\": $(grep -o '"hidden_size": [0-9]*' "$folder/config.json" | grep -o '[0-9]*$')" "$ck/config.json" &&
       grep -q '"vocab_size": 512' "$ck/config.json"; then ok; else bad "$family: checkpoint shape"; fi
    if grep -q '"loss":[0-9]' "$metrics"; then ok; else bad "$family: no loss in metrics"; fi
    if grep -q "^weights: $folder" "$tmp/$family.log"; then ok; else bad "$family: weights line"; fi
    # The folder's tokenizer and its chat_template.jinja's template.
    if grep -q "^config: runs/qwen3/run_config.json | tokenizer $folder | chat template $family | eval datasets/synthetic/eval.jsonl" "$tmp/$family.log"
    then ok; else bad "$family: config line: $(grep '^config' "$tmp/$family.log")"; fi
    rm -rf "$work/runs"
done
finish
