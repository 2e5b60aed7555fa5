#!/usr/bin/env python3
"""Builds the tiny Hugging Face model folders of tests/data/hf/ with transformers (CPU,
offline, random weights) and their reference logits and loss.

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers
    /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py [--out tests/data/hf]

Each folder holds what save_pretrained writes (config.json, model.safetensors or two
shards with model.safetensors.index.json, generation_config.json), reference.json:
token ids, position ids (one causal row, positions starting past 0), targets (the next
token, -1 on the last) and the mean cross-entropy over the targets, and
reference.safetensors: the fp32 logits [seq, vocab]; both computed by transformers in fp32 from the stored weights (bf16 weights
upcast exactly, as onepass does). CI never runs this: the output is committed. The CUDA backend's logits check
(tests/test_hf_model_cuda.cu) uses the CUDA shapes of three of them:

    /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py --cuda-shapes --out tests/data/hf_cuda \
        --only llama_linear_f16,qwen2_bias_bf16,qwen3_qknorm_sharded
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

SEQ = 16
FIRST_POSITION = 5  # positions FIRST_POSITION .. FIRST_POSITION + SEQ - 1
COMMON = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, initializer_range=0.3,
              attn_implementation="eager")  # range 0.3: logits O(1), attention peaked


def fixtures(cuda_shapes=False):
    if cuda_shapes:  # head_dim 64 (qwen3: 128), what the CUDA attention kernels take
        # Range 0.1: logits O(1) and bf16 activations within cosine 0.9999 of fp32.
        COMMON.update(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                      initializer_range=0.1)
    # Llama with llama3 RoPE scaling: head_dim 8, theta 5e5 -> wavelengths 6.3, 167, 4443,
    # 1.2e5 against bands at 64 and 256: one kept, one smoothed, two scaled.
    yield "llama3_scaling", LlamaConfig(
        **COMMON, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=256)), torch.float32, None
    # Llama, linear scaling, tied, stored in f16.
    yield "llama_linear_f16", LlamaConfig(
        **COMMON, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)), \
        torch.float16, None
    # Qwen2: q/k/v biases, tied, bf16.
    yield "qwen2_bias_bf16", Qwen2Config(
        **COMMON, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), torch.bfloat16, None
    # Qwen3: q/k norm, head_dim 16 != hidden 32 / 4 heads, untied, bf16, two shards.
    yield "qwen3_qknorm_sharded", Qwen3Config(
        **COMMON, head_dim=128 if cuda_shapes else 16, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), torch.bfloat16, "100KB"


def reference(model, vocab):
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, vocab, (1, SEQ), generator=gen)
    positions = torch.arange(FIRST_POSITION, FIRST_POSITION + SEQ).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=tokens, position_ids=positions).logits[0].float()
    targets = torch.cat([tokens[0, 1:], torch.tensor([-1])])
    loss = torch.nn.functional.cross_entropy(logits[:-1].double(), targets[:-1], reduction="mean")
    return {
        "transformers_version": transformers.__version__,
        "tokens": tokens[0].tolist(),
        "positions": positions[0].tolist(),
        "targets": targets.tolist(),
        "loss": float(loss),
    }, logits.contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/hf")
    ap.add_argument("--cuda-shapes", action="store_true",
                    help="hidden 128 (head_dim 64, Qwen3's 128) for the CUDA backend "
                         "(committed: --only the three of tests/data/hf_cuda)")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.out, exist_ok=True)
    for name, config, dtype, shard in fixtures(args.cuda_shapes):
        if only and name not in only:
            continue
        torch.manual_seed(1234)
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # visible biases and norm weights, not their 0/1 init
            for pname, p in model.named_parameters():
                if pname.endswith("bias") or "norm" in pname:
                    p.add_(0.1 * torch.randn(p.shape))
        model = model.to(dtype)
        folder = os.path.join(args.out, name)
        shutil.rmtree(folder, ignore_errors=True)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(folder, **kwargs)
        # The reference from the stored weights, in fp32.
        ref_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                         attn_implementation="eager")
        ref_model.eval()
        ref, logits = reference(ref_model, config.vocab_size)
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump(ref, f)
        save_file({"logits": logits}, os.path.join(folder, "reference.safetensors"))
        print(name, sorted(os.listdir(folder)))


if __name__ == "__main__":
    main()
