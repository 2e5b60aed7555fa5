#!/usr/bin/env python3
"""What a PyTorch user runs instead of onepass's attention, timed the way bench_attention
times ours: B=1, bf16, the masks of masks.py, forward and forward+backward, triton's
do_bench (50 ms warm-up, median of 300 ms of runs).

    [H=16] [KV=H] [D=128] [METHODS=flex,sdpa_dense,sdpa_causal] python3 bench/anchors/attention.py [S...]

S defaults to 4096 16384. METHODS, comma-separated:
  flex         FlexAttention with a BlockMask, its Triton backend, under torch.compile
  fa4          FlexAttention with its FlashAttention-4 backend (kernel_options BACKEND=FLASH,
               CuTe DSL kernels). Needs the FA4 wheels (bench/run_gpu.sh, "FlashAttention-4")
               and a process of its own: with the Triton backend in the same process every
               call fell back to the unfused path.
  sdpa_dense   scaled_dot_product_attention with the dense boolean mask
  sdpa_causal  scaled_dot_product_attention with is_causal (flash or cuDNN): the same work on
               every mask, what a kernel that ignores the mask's structure costs
One JSON line per (S, mask): milliseconds per method and pass ("ERR ..." where a method
fails at that shape), FlexAttention's block sparsity, the dense mask's sparsity, and the
useful TFLOP/s of the mask-exact methods (visible pairs only: 4 S^2 D H density for the
forward, 3.5 times that for forward+backward, as bench_attention counts).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from triton.testing import do_bench

from masks import MASKS, mask_mod, tags

KNOWN = ("flex", "fa4", "sdpa_dense", "sdpa_causal")
B = 1
H = int(os.environ.get("H", 16))
KV = int(os.environ.get("KV", H))
D = int(os.environ.get("D", 128))
METHODS = os.environ.get("METHODS", "flex,sdpa_dense,sdpa_causal").split(",")
unknown = [m for m in METHODS if m not in KNOWN]
if unknown:
    sys.exit(f"attention.py: unknown METHODS {unknown} (known: {', '.join(KNOWN)})")
if "fa4" in METHODS and len(METHODS) > 1:
    sys.exit("attention.py: METHODS=fa4 runs alone: beside another backend in one process "
             "FlexAttention falls back to its unfused path")
dev = "cuda"
gqa = KV != H
flex = torch.compile(flex_attention, dynamic=False)


def attend(method, q, k, v, block_mask, dense):
    if method == "flex":
        return flex(q, k, v, block_mask=block_mask, enable_gqa=gqa, kernel_options={"BACKEND": "TRITON"})
    if method == "fa4":
        return flex(q, k, v, block_mask=block_mask, enable_gqa=gqa, kernel_options={"BACKEND": "FLASH"})
    if method == "sdpa_dense":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def measure(S, kind):
    """One JSON row: every method of METHODS at sequence length S under mask kind."""
    mm = mask_mod(kind, *tags(kind, S, dev))
    block_mask = create_block_mask(mm, None, None, S, S, device=dev)
    q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k, v = [torch.randn(B, KV, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    dout = torch.randn_like(q)
    qi = torch.arange(S, device=dev)
    dense = mm(0, 0, qi[:, None], qi[None, :])
    density = dense.float().mean().item()
    useful = 4 * S * S * D * H * B * density  # visible pairs only
    r = dict(H=H, KV=KV, D=D, S=S, mask=kind, flex_sparsity_pct=round(block_mask.sparsity(), 2),
             dense_sparsity=round(1 - density, 4))
    for m in METHODS:
        def fwd():
            return attend(m, q, k, v, block_mask, dense)

        def fwdbwd():
            fwd().backward(dout)

        for name, fn, flops in (("fwd", fwd, useful), ("fwdbwd", fwdbwd, 3.5 * useful)):
            key = f"{m}_{name}"
            try:
                ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
            except Exception as e:  # one method failing at one shape is a result too
                r[key] = "ERR " + type(e).__name__ + ": " + str(e)[:160]
                continue
            r[key] = round(ms, 4)
            if m != "sdpa_causal":
                r[key + "_tflops"] = round(flops / (ms * 1e-3) / 1e12, 1)
    return r


def main():
    torch.manual_seed(0)
    for S in [int(x) for x in sys.argv[1:]] or [4096, 16384]:
        for kind in MASKS:
            print(json.dumps(measure(S, kind)), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
