#!/usr/bin/env bash
# Wall time of the layouts at a real model shape: npass (honest), duplicate, mask_only,
# as_rendered and preserve train the same generated conversations (`train gen-data
# --profile`, each fitting one row of --seq-len) from a folder holding only the model's
# config.json (random initialisation, no weights needed), and a table reports per layout
# the tokens processed, the wall time of the timed steps, tokens/s, npass-equivalent
# tokens/s (the tokens npass would process for the same conversations, per second) and
# the GPU memory in use, with each layout's time and token ratios to npass.
#
# usage: scripts/repro/layout_walltime.sh [--model DIR] [--profile chat|agentic]
#            [--seq-len N] [--tokens-per-step N] [--steps N] [--skip N]
#            [--conversations N] [--layouts "npass duplicate ..."] [--runs DIR]
#            [--md FILE] [--tiny] [--table-only] [--set key=value]...
#   --model     a folder with the model's config.json (default configs/hf/qwen3-0.6b); its
#               bos/eos token ids are dropped, as the runs use the 512-piece synthetic
#               tokenizer (its ids are rows of any of these embeddings)
#   defaults    chat, seq_len 32768, 65536 trained tokens per step, 12 steps of which the
#               first 2 are not timed, 400 conversations, runs/layout_walltime
#   --tiny      a CPU-sized check of the plumbing: a 2-layer hidden-64 Qwen3 shape,
#               seq_len 4096, 3 steps of 2048 trained tokens, 40 conversations, backend
#               cpu (numbers mean nothing there); the flags above still apply
#   --table-only the table from the metrics already in --runs (of a run stopped after its
#               last layout trained); nothing is generated or trained
# Needs the built trainer (./train, or the binary named by $TRAIN); backend auto (CUDA
# where built and a GPU is present).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
train="${TRAIN:-$root/train}"
model="configs/hf/qwen3-0.6b" profile=chat runs="runs/layout_walltime" md="" tiny=0 table_only=0
seq_len="" tps="" steps="" skip="" n_conv=""
layouts="npass duplicate mask_only as_rendered preserve"
overrides=()
while [ $# -gt 0 ]; do
    case "$1" in
        --model) model="$2"; shift 2 ;;
        --profile) profile="$2"; shift 2 ;;
        --seq-len) seq_len="$2"; shift 2 ;;
        --tokens-per-step) tps="$2"; shift 2 ;;
        --steps) steps="$2"; shift 2 ;;
        --skip) skip="$2"; shift 2 ;;
        --conversations) n_conv="$2"; shift 2 ;;
        --layouts) layouts="$2"; shift 2 ;;
        --runs) runs="$2"; shift 2 ;;
        --md) md="$2"; shift 2 ;;
        --table-only) table_only=1; shift ;;
        --tiny) tiny=1; shift ;;
        --set) overrides+=(--set "$2"); shift 2 ;;
        *) echo "layout_walltime.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
if [ "$tiny" = 1 ]; then  # the tiny defaults; flags given still win
    seq_len=${seq_len:-4096} tps=${tps:-2048} steps=${steps:-3} skip=${skip:-1} n_conv=${n_conv:-40}
    overrides=(--set backend=cpu "${overrides[@]}")
fi
seq_len=${seq_len:-32768} tps=${tps:-65536} steps=${steps:-12} skip=${skip:-2} n_conv=${n_conv:-400}
[ "$skip" -lt "$steps" ] || { echo "layout_walltime.sh: --skip must be below --steps" >&2; exit 2; }
md="${md:-$runs/LAYOUT_WALLTIME.md}"
[ "$table_only" = 1 ] || rm -rf "$runs/model" "$runs/data"
mkdir -p "$runs/model" "$(dirname "$md")"

if [ "$tiny" = 1 ]; then
    cat > "$runs/model/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
 "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "rms_norm_eps": 1e-6,
 "rope_theta": 1000000, "tie_word_embeddings": true, "max_position_embeddings": 40960}
JSON
    shape="tiny qwen3 (hidden 64, 2 layers)"
else
    [ -f "$model/config.json" ] || { echo "layout_walltime.sh: $model/config.json not found" >&2; exit 2; }
    grep -v '"\(bos\|eos\|pad\)_token_id"' "$model/config.json" > "$runs/model/config.json"
    shape="$model"
fi

if [ "$table_only" = 0 ]; then
    "$train" gen-data --profile "$profile" --out-dir "$runs/data" --train "$n_conv" --eval 0 \
        --max-tokens "$seq_len" --seed 1 > /dev/null

    for layout in $layouts; do
        out="$runs/$layout"
        rm -rf "$out"
        echo "== $layout" >&2
        "$train" --set model.init_from="$runs/model" --set data.tokenizer=datasets/synthetic/tokenizer.model \
            --set data.tokenizer_override=true --set data.chat_template=onepass \
            --set data.train_path="$runs/data/train.jsonl" --set data.eval_path=null \
            --set data.eval_holdout=0 --set data.layout="$layout" --set data.seq_len="$seq_len" \
            --set train.steps="$steps" --set train.tokens_per_step="$tps" --set train.micro_rows=1 \
            --set train.warmup_steps=0 --set train.lr=1e-5 --set train.deterministic=false \
            --set train.checkpoint_every=0 --set eval.every=0 --set out_dir="$out" \
            "${overrides[@]}" > "$runs/$layout.log" 2>&1 ||
            { echo "layout_walltime.sh: $layout failed:" >&2; tail -5 "$runs/$layout.log" >&2; exit 1; }
        rm -rf "$out"/checkpoint-*  # the last step's checkpoint: only the metrics are used
    done
fi

# Per layout over the timed steps (skip+1..steps): step time = tokens / tokens_per_s (one
# rank), npass tokens = npass_equivalent_tokens_per_s x step time.
summary() {  # summary <metrics.jsonl>: tokens, trained tokens, seconds, npass tokens, GiB
    awk -v skip="$skip" '
    function field(k,   m) { if (match($0, "\"" k "\":[-0-9.eE+]+")) return substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3) + 0; return 0 }
    field("step") > skip {
        t = field("tokens") / field("tokens_per_s")
        tokens += field("tokens"); trained += field("trained_tokens"); time += t
        npass += field("npass_equivalent_tokens_per_s") * t
        m = field("gpu_memory_gib"); if (m > mem) mem = m
    }
    END { printf "%d %d %.6f %.0f %.2f\n", tokens, trained, time, npass, mem }' "$1"
}
{
    echo "Layouts at $shape, profile $profile, data.seq_len $seq_len, $tps trained tokens per step,"
    echo "steps $((skip + 1))-$steps timed; $(grep -m1 '^backend:' "$runs/$(set -- $layouts; echo "$1").log")."
    echo
    echo "| layout | tokens processed | trained | wall time (s) | tokens/s | npass-eq tokens/s | GPU memory (GiB) | tokens vs npass | time vs npass | time ratio / token ratio |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    read -r n_tok n_tr n_time n_np n_mem < <(summary "$runs/npass/metrics.jsonl" 2>/dev/null || echo "0 0 0 0 0")
    for layout in $layouts; do
        read -r tok tr time np mem < <(summary "$runs/$layout/metrics.jsonl")
        awk -v l="$layout" -v tok="$tok" -v tr="$tr" -v time="$time" -v np="$np" -v mem="$mem" \
            -v ntok="$n_tok" -v ntime="$n_time" -v nnp="$n_np" 'BEGIN {
            mems = mem > 0 ? sprintf("%.2f", mem) : "n/a"
            if (ntok > 0 && ntime > 0 && np > 0) {
                # the same conversations: npass tokens of this run over npass run tokens
                rt = (tok / np); rtime = (time / np) / (ntime / nnp)
                ratios = sprintf("%.3f | %.3f | %.3f", rt, rtime, rtime / rt)
            } else ratios = "n/a | n/a | n/a"
            printf "| %s | %d | %d | %.3f | %.0f | %.0f | %s | %s |\n", l, tok, tr, time,
                   tok / time, np / time, mems, ratios }'
    done
    echo
    echo "Ratios compare the same conversations: a layout's tokens and time per npass token"
    echo "(npass-equivalent) over npass's own; the goal for duplicate is a last column <= 1.10."
} | tee "$md"
