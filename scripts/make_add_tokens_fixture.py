#!/usr/bin/env python3
"""model.add_tokens' reference (tests/cli_add_tokens.sh): the chatml fixture tokenizer
(no <think>, no tool tokens) with the Qwen3 template's missing control tokens added by the
`tokenizers` package itself, as special tokens, saved as tests/data/add_tokens/tokenizer.json.
onepass with model.add_tokens must give the ids this file gives.

    /tmp/hfvenv/bin/python scripts/make_add_tokens_fixture.py
"""
import os

from tokenizers import AddedToken, Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

tok = Tokenizer.from_file(os.path.join(ROOT, "tests/data/templates/chatml/tokenizer.json"))
before = tok.get_vocab_size()
tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED])
out = os.path.join(ROOT, "tests/data/add_tokens")
os.makedirs(out, exist_ok=True)
tok.save(os.path.join(out, "tokenizer.json"))
for t in ADDED:
    print(t, tok.token_to_id(t))
print("vocab", before, "->", tok.get_vocab_size())
