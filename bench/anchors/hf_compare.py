#!/usr/bin/env python3
"""The real client: loads a Hugging Face folder written by onepass with
transformers.AutoModelForCausalLM.from_pretrained and computes its loss on packed rows
(`train pack` JSONL: tokens, targets, pos, lo, hi per slot) with the position ids and
the [lo, hi) mask as a 4-D additive mask (key k visible to query q iff lo[k] <= q < hi[k]),
then compares it with onepass's eval loss (the last eval_loss of metrics.jsonl).

    python3 bench/anchors/hf_compare.py --export DIR --rows rows.jsonl --metrics metrics.jsonl [--tol 5e-3]
Prints "OK ..." or "FAIL ..." and exits 0 or 1. Runs on the GPU machine (no internet).
"""
import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--tol", type=float, default=5e-3)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.export, dtype=torch.float32,
                                                 attn_implementation="eager").to(device).eval()
    total, count = 0.0, 0
    with open(args.rows) as f:
        for line in f:
            row = json.loads(line)
            tokens = torch.tensor([row["tokens"]], device=device)
            pos = torch.tensor([row["pos"]], device=device)
            targets = torch.tensor(row["targets"], device=device)
            lo = torch.tensor(row["lo"], device=device)
            hi = torch.tensor(row["hi"], device=device)
            q = torch.arange(tokens.shape[1], device=device)[:, None]
            visible = (lo[None, :] <= q) & (q < hi[None, :])
            mask = torch.zeros(visible.shape, device=device)
            mask[~visible] = torch.finfo(torch.float32).min
            with torch.no_grad():
                logits = model(input_ids=tokens, position_ids=pos,
                               attention_mask=mask[None, None]).logits[0].double()
            keep = targets >= 0
            total += float(torch.nn.functional.cross_entropy(logits[keep], targets[keep],
                                                             reduction="sum"))
            count += int(keep.sum())
    hf_loss = total / count
    onepass = [json.loads(line) for line in open(args.metrics)]
    onepass_loss = [m["eval_loss"] for m in onepass if "eval_loss" in m][-1]
    rel = abs(hf_loss - onepass_loss) / hf_loss
    print(f"info {args.export}: transformers loss {hf_loss:.6f} over {count} targets, "
          f"onepass eval loss {onepass_loss:.6f}, relative difference {rel:.2e}")
    ok = rel <= args.tol
    print(("OK" if ok else "FAIL") + f" loss within {args.tol:g}: {args.export}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
