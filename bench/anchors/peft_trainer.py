#!/usr/bin/env python3
"""What a PEFT user runs instead of onepass's LoRA, timed beside `bench_trainer --set
lora.r=16`: transformers' own model class for the config, random weights in bf16, PEFT's
LoRA on all seven linear projections, AdamW (fused) on the adapters, one packed row of S
random tokens per step.

    [ATTN=sdpa|flex] [CKPT=1] [COMPILE=1] python3 bench/anchors/peft_trainer.py CONFIG [S]
        [--r 16] [--alpha 32] [--steps 10] [--warmup 3] [--device cuda|cpu]

CONFIG is a benchmark config (configs/bench_*.json: its model.* keys, or model.init_from's
config.json, a path from the repository root as bench_trainer reads it) or a Hugging Face
config.json or its folder. S defaults to CONFIG's data.seq_len, else 8192.

- Model: AutoModelForCausalLM.from_config (Qwen3ForCausalLM for the Qwen3 configs), built
  on the device with random weights in bf16; attn_implementation "sdpa" (ATTN=sdpa, the
  default) or "flex_attention" (ATTN=flex).
- Adapters: peft.get_peft_model with LoraConfig(r, lora_alpha, target_modules q_proj k_proj
  v_proj o_proj gate_proj up_proj down_proj, lora_dropout 0, bias "none"), onepass's
  lora.* defaults; PEFT keeps the adapters in fp32 beside the bf16 base.
- Step: forward under bf16 autocast (what Trainer's bf16=True does) with labels (the
  model's own shifted cross-entropy), backward, torch.optim.AdamW(fused=True, lr 1e-4,
  weight decay 0.01) on the adapters. CKPT=1: model.gradient_checkpointing_enable() with
  use_reentrant False (how transformers users train long rows). COMPILE=1: torch.compile of
  the PEFT model.
- Mask: bench_trainer's row has the strip-thinking mask of bench/anchors/masks.py, which
  transformers cannot take through SDPA without a dense S x S mask (and so without its
  flash kernels). ATTN=sdpa runs plain causal attention instead, and ATTN=flex runs causal
  too unless STRIP=1 passes the strip-thinking BlockMask as the attention mask (transformers
  hands a BlockMask to flex_attention as it is). Causal is denser than or equal to the strip
  mask, so causal rows favour this anchor: it does the same or more attention work per
  token than bench_trainer, yet its FLOP count below is the strip mask's.

Prints one JSON line: base parameters, step time (mean of --steps steps after --warmup
warm-up steps), tokens/s, peak GPU memory (torch.cuda.max_memory_allocated; null on the
CPU) and MFU against 790 TFLOP/s with bench_trainer's LoRA FLOP count:
4 (params - vocab d) S + 3.5 * 4 S^2 hd H L density, params the base model's (the tied
head counted once, no lookup subtracted then), density the non-empty fraction of the
strip-thinking mask's 128 x 128 tiles. `--device cpu` runs the same on the CPU (a check
that the script runs at a tiny shape; its numbers mean nothing).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_config import read_config  # noqa: E402
from masks import mask_mod, tags  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PEAK_TFLOPS = 790.0
TILE = 128


def hf_config(mc):
    """A transformers config of the model config; bench configs without model_type are
    Llama blocks, as onepass reads them."""
    from transformers import AutoConfig
    mc = dict(mc)
    model_type = mc.pop("model_type", "llama")
    for k in ("architectures", "transformers_version", "torch_dtype", "dtype"):
        mc.pop(k, None)
    cfg = AutoConfig.for_model(model_type, **mc)
    cfg.use_cache = False
    return cfg


def build_model(cfg, attn, dev):
    """AutoModelForCausalLM.from_config on the device, bf16 weights."""
    import transformers
    from packaging.version import Version
    from transformers import AutoModelForCausalLM
    # transformers 4.56 renamed torch_dtype to dtype.
    dtype_kw = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    with torch.device(dev):
        return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, **{dtype_kw: torch.bfloat16})


def strip_density(S, dev):
    """The non-empty fraction of the strip-thinking mask's TILE x TILE tiles (FlexAttention's
    BlockMask blocks, bench_trainer's density_128)."""
    fn = mask_mod("strip_thinking", *tags("strip_thinking", S, dev))
    n = (S + TILE - 1) // TILE
    k = torch.arange(S, device=dev)
    nonempty = 0
    for i in range(n):
        q = torch.arange(i * TILE, min((i + 1) * TILE, S), device=dev)
        m = fn(None, None, q[:, None], k[None, :])  # [tile, S]
        m = torch.nn.functional.pad(m, (0, n * TILE - S)).view(len(q), n, TILE)
        nonempty += int(m.any(dim=2).any(dim=0).sum())
    return nonempty / (n * n)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("S", nargs="?", type=int)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = p.parse_args()
    attn = {"sdpa": "sdpa", "flex": "flex_attention"}.get(os.environ.get("ATTN", "sdpa"))
    if attn is None:
        sys.exit(f"peft_trainer.py: ATTN must be sdpa or flex, got {os.environ['ATTN']!r}")
    ckpt = os.environ.get("CKPT", "0") not in ("", "0")
    use_compile = os.environ.get("COMPILE", "0") not in ("", "0")
    strip = os.environ.get("STRIP", "0") not in ("", "0")
    if strip and attn != "flex_attention":
        sys.exit("peft_trainer.py: STRIP=1 needs ATTN=flex (SDPA takes the mask only as a dense S x S tensor)")
    if a.steps < 1 or a.warmup < 0:
        sys.exit("peft_trainer.py: --steps must be positive and --warmup not negative")

    import peft
    import transformers
    from peft import LoraConfig, get_peft_model

    mc, seq_len = read_config(a.config)
    S = a.S or seq_len or 8192
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device", flush=True)
        sys.exit(77)
    torch.manual_seed(0)
    cfg = hf_config(mc)
    model = build_model(cfg, attn, dev)
    vocab, d = cfg.vocab_size, cfg.hidden_size
    H, L = cfg.num_attention_heads, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or d // H
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    nparams = sum(p.numel() for p in model.parameters())  # a tied head once
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=a.r, lora_alpha=a.alpha, target_modules=TARGETS,
                                             lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_adapter = sum(p.numel() for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.01, fused=True)
    step_model = torch.compile(model) if use_compile else model
    model.train()

    g = torch.Generator(device="cpu").manual_seed(0)
    idx = torch.randint(0, vocab, (1, S), generator=g).to(dev)
    labels = torch.randint(0, vocab, (1, S), generator=g).to(dev)
    extra = {}
    if strip:
        from torch.nn.attention.flex_attention import create_block_mask
        extra["attention_mask"] = create_block_mask(mask_mod("strip_thinking", *tags("strip_thinking", S, dev)),
                                                    None, None, S, S, device=dev)

    def step():
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = step_model(input_ids=idx, labels=labels, **extra).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    if dev == "cuda":  # the peak of the steps (the weights included), not of building the mask
        torch.cuda.reset_peak_memory_stats()
    for _ in range(a.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    if not torch.isfinite(loss.detach()).item():
        sys.exit(f"peft_trainer.py: the loss is {loss.item()}")
    density = strip_density(S, dev)
    lookup = 0 if tied else vocab * d
    flops = 4 * (nparams - lookup) * S + 3.5 * 4 * S * S * hd * H * L * density
    mem = round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev == "cuda" else None
    print(json.dumps(dict(model=os.path.basename(os.path.normpath(a.config)), params_M=round(nparams / 1e6, 1), S=S,
                          attn=os.environ.get("ATTN", "sdpa"), mask="strip_thinking" if strip else "causal",
                          ckpt=ckpt, compile=use_compile, lora_r=a.r, adapter_params_M=round(n_adapter / 1e6, 2),
                          step_ms=round(dt * 1e3, 2), tokens_per_s=round(S / dt), mem_GiB=mem,
                          mfu_vs_790=round(flops / dt / (PEAK_TFLOPS * 1e12), 3), density_128=round(density, 4),
                          loss_last=round(loss.item(), 4), steps=a.steps, device=dev,
                          torch=torch.__version__, transformers=transformers.__version__, peft=peft.__version__)),
          flush=True)


if __name__ == "__main__":
    main()
