"""The three masks of the benchmarks as PyTorch sees them: per-token tags and FlexAttention
mask_mods. bench/bench_attention.cu (make_tags, visible) and bench/bench_trainer.cu
(strip_thinking_row) build the same masks as one visible interval per key.

  causal          key k visible to query q iff k <= q
  shared_prefix   a prefix of S/4 tokens, then 4 completions of equal length: causal, and a
                  completion sees the prefix and itself only
  strip_thinking  4 turns, each user 1/8, think 5/8, answer 2/8: causal, and a later turn
                  does not see an earlier turn's thinking
"""
import torch

MASKS = ("causal", "shared_prefix", "strip_thinking")
N_TURNS = 4


def tags(kind, S, device):
    """seg (0 on the shared prefix, i + 1 on completion i), turn, and role (0 user, 1 think,
    2 answer) of every token, as int32 tensors of length S."""
    seg = torch.zeros(S, dtype=torch.int32, device=device)
    turn = torch.zeros_like(seg)
    role = torch.zeros_like(seg)
    if kind == "shared_prefix":
        p = S // 4
        s = (S - p) // 4
        for i in range(4):
            seg[p + i * s: p + (i + 1) * s] = i + 1
    elif kind == "strip_thinking":
        tl = S // N_TURNS
        for t in range(N_TURNS):
            b = t * tl
            turn[b:b + tl] = t
            role[b + tl // 8: b + tl // 8 + 5 * tl // 8] = 1
            role[b + 6 * tl // 8: b + tl] = 2
    return seg, turn, role


def mask_mod(kind, seg, turn, role):
    """FlexAttention's mask_mod(b, h, q, k) of the mask; on index tensors it gives the dense
    boolean mask too."""
    if kind == "causal":
        return lambda b, h, q, k: q >= k
    if kind == "shared_prefix":
        return lambda b, h, q, k: (q >= k) & ((seg[k] == 0) | (seg[k] == seg[q]))
    return lambda b, h, q, k: (q >= k) & ~((role[k] == 1) & (turn[k] < turn[q]))
