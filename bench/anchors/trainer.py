#!/usr/bin/env python3
"""What a PyTorch user runs instead of onepass's trainer, timed beside bench_trainer: a
training step (forward, backward, fused AdamW, bf16 autocast, torch.compile, FlexAttention)
of the same model on one packed row of S random tokens under the strip-thinking mask of
masks.py.

    [BACKEND=FLASH] [CKPT=1] python3 bench/anchors/trainer.py CONFIG [S] [compile: 1|0]

CONFIG is a benchmark config (configs/bench_*.json: its model.* keys, or model.init_from's
config.json, a path from the repository root as bench_trainer reads it) or a Hugging Face
config.json or its folder. S defaults to CONFIG's data.seq_len, else 8192; compile to 1.
The model is onepass's reading of the config: Llama blocks (RMSNorm, RoPE, grouped-query
attention, SwiGLU), head_dim (default hidden / heads), q_norm/k_norm for model_type qwen3,
q/k/v biases for qwen2, the tied head, RoPE theta and RMSNorm eps.
BACKEND=FLASH selects FlexAttention's FlashAttention-4 backend (needs the FA4 wheels:
bench/run_gpu.sh, "FlashAttention-4"); CKPT=1 checkpoints each block's activations (how
PyTorch users train long rows) and compiles the way torchtitan does for it: each
checkpointed block on its own (one graph that every layer reuses, so compiling does not
grow with the depth) and the final norm, head and loss as one more, where the whole
model is one graph otherwise.
Prints one JSON line: parameters, step time (mean of STEPS steps, default 20, after 5
warm-up steps), tokens/s, peak GPU memory, and MFU against 790 TFLOP/s with
bench_trainer's FLOP count.
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from bench_config import read_config
from masks import mask_mod, tags


if len(sys.argv) < 2:
    sys.exit(__doc__)
mc, seq_len = read_config(sys.argv[1])
S = int(sys.argv[2]) if len(sys.argv) > 2 else seq_len or 8192
use_compile = sys.argv[3] == "1" if len(sys.argv) > 3 else True
vocab, d, L = mc["vocab_size"], mc["hidden_size"], mc["num_hidden_layers"]
H = mc["num_attention_heads"]
KV = mc.get("num_key_value_heads", H)
ffn = mc["intermediate_size"]
hd = mc.get("head_dim") or d // H
qk_norm = mc.get("model_type") == "qwen3"
bias = mc.get("model_type") == "qwen2"
tied = mc.get("tie_word_embeddings", False)
theta = mc.get("rope_theta", 10000.0)
eps = mc.get("rms_norm_eps", 1e-5)
dev = "cuda"
torch.manual_seed(0)

block_mask = create_block_mask(mask_mod("strip_thinking", *tags("strip_thinking", S, dev)), None, None, S, S,
                               device=dev)
flex = torch.compile(flex_attention, dynamic=False)
FLEX_KW = {"kernel_options": {"BACKEND": os.environ["BACKEND"]}} if os.environ.get("BACKEND") else {}


def rope(x, pos):
    n = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, n, 2, device=x.device, dtype=torch.float32) / n))
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : n // 2], x[..., n // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.RMSNorm(d, eps=eps)
        s.n2 = nn.RMSNorm(d, eps=eps)
        s.q = nn.Linear(d, H * hd, bias=bias)
        s.kv = nn.Linear(d, 2 * KV * hd, bias=bias)
        s.qn = nn.RMSNorm(hd, eps=eps) if qk_norm else nn.Identity()
        s.kn = nn.RMSNorm(hd, eps=eps) if qk_norm else nn.Identity()
        s.o = nn.Linear(H * hd, d, bias=False)
        s.gu = nn.Linear(d, 2 * ffn, bias=False)
        s.dn = nn.Linear(ffn, d, bias=False)

    def forward(s, x, pos):
        B = x.shape[0]
        h = s.n1(x)
        q = s.q(h).view(B, S, H, hd).transpose(1, 2)
        k, v = s.kv(h).view(B, S, 2, KV, hd).permute(2, 0, 3, 1, 4)
        q, k = rope(s.qn(q), pos), rope(s.kn(k), pos)
        a = flex(q, k, v, block_mask=block_mask, enable_gqa=True, **FLEX_KW)
        x = x + s.o(a.transpose(1, 2).reshape(B, S, -1))
        g, u = s.gu(s.n2(x)).chunk(2, -1)
        return x + s.dn(F.silu(g) * u)


class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(vocab, d)
        s.blocks = nn.ModuleList([Block() for _ in range(L)])
        s.norm = nn.RMSNorm(d, eps=eps)
        s.head = nn.Linear(d, vocab, bias=False)
        if tied:
            s.head.weight = s.emb.weight

    def forward(s, idx, pos, tgt):
        x = s.emb(idx)
        for b in s.blocks:
            x = b(x, pos)
        return s.loss(x, tgt)

    def loss(s, x, tgt):
        logits = s.head(s.norm(x)).float()
        return F.cross_entropy(logits.view(-1, vocab), tgt.view(-1))


class Checkpointed(nn.Module):
    """A block whose activations are recomputed in the backward."""

    def __init__(s, block):
        super().__init__()
        s.block = block

    def forward(s, x, pos):
        return torch.utils.checkpoint.checkpoint(s.block, x, pos, use_reentrant=False)


model = LM().to(dev)
nparams = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
step_model = model
if os.environ.get("CKPT"):
    for i, b in enumerate(model.blocks):
        model.blocks[i] = torch.compile(Checkpointed(b)) if use_compile else Checkpointed(b)
    if use_compile:
        model.loss = torch.compile(model.loss)
elif use_compile:
    step_model = torch.compile(model)
idx = torch.randint(0, vocab, (1, S), device=dev)
tgt = torch.randint(0, vocab, (1, S), device=dev)
pos = torch.arange(S, device=dev)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step_model(idx, pos, tgt)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(5):
    step()
torch.cuda.synchronize()
n = int(os.environ.get("STEPS", 20))
t0 = time.perf_counter()
for _ in range(n):
    step()
torch.cuda.synchronize()
dt = (time.perf_counter() - t0) / n
density = 1.0 - block_mask.sparsity() / 100
lookup = 0 if tied else vocab * d  # a tied head is counted once, and is a matmul
flops = 6 * (nparams - lookup) * S + 3.5 * 4 * S * S * hd * H * L * density  # matmuls + useful attention
print(json.dumps(dict(model=os.path.basename(os.path.normpath(sys.argv[1])), params_M=round(nparams / 1e6, 1), S=S,
                      compile=use_compile, step_ms=round(dt * 1e3, 2), tokens_per_s=round(S / dt),
                      mem_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 2), ckpt=bool(os.environ.get("CKPT")),
                      mfu_vs_790=round(flops / dt / 790e12, 3))), flush=True)
