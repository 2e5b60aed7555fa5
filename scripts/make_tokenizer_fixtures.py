#!/usr/bin/env python3
"""Fixture tokenizers and reference ids for tests/test_tokenizer_fixtures.c.

Trains, on the shipped conversations plus generated multilingual text, small tokenizers
of each style data/bpe.c and data/tokenizer.cc implement:
  gpt2      ByteLevel(use_regex) pre-tokenizer, merges as "a b" strings, <|endoftext|>
            only (it lacks the template's tokens: the refusal test uses it)
  llama3    Split(Llama-3 regex) + ByteLevel, ignore_merges, the template's tokens
  qwen2     NFC + Split(Qwen2 regex) + ByteLevel, the template's tokens and a
            non-special added token
  sp_dummy  SentencePiece BPE with byte fallback and a dummy prefix (Llama-2 style),
            the template's tokens as user-defined symbols
and writes, for a corpus of strings, the reference ids of the `tokenizers` and
`sentencepiece` packages: "ids" (added tokens matched) and, for the BPE ones,
"plain_ids" (no added token matched: the reference tokenizer without added_tokens),
and "decoded", the reference decode of ids.

  scripts/make_tokenizer_fixtures.py               writes tests/data/tokenizers/
  scripts/make_tokenizer_fixtures.py --bench DIR   only a ~150k-vocabulary Qwen2-style
                                                   tokenizer in DIR/tokenizer.json
Needs `pip install tokenizers sentencepiece`; CI never runs it (the outputs are committed).
"""
import argparse
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<think>", "</think>", "<|end|>"]
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def render(messages):
    """The onepass template (data/tokenize.c): the whole conversation, reasoning kept."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            out.append("<|assistant|>")
            if m.get("reasoning_content"):
                out.append("<think>" + m["reasoning_content"] + "</think>")
            out.append(m["content"] + "<|end|>")
        else:
            out.append(("<|system|>" if m["role"] == "system" else "<|user|>") + m["content"])
    return "".join(out)


SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}


def messages_of(line):
    """The "messages" of a line; ShareGPT turns become messages (inline <think> kept as text)."""
    d = json.loads(line)
    if "messages" in d:
        return d["messages"]
    return [{"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in d["conversations"]]


def conversations(path, n):
    with open(path, encoding="utf-8") as f:
        return [render(messages_of(line)) for line in f.readlines()[:n]]


SCRIPTS = {  # code point ranges of a few writing systems
    "latin": (0x61, 0x7A), "greek": (0x3B1, 0x3C9), "cyrillic": (0x430, 0x44F),
    "arabic": (0x627, 0x64A), "devanagari": (0x915, 0x939), "cjk": (0x4E00, 0x4FFF),
    "hangul": (0xAC00, 0xAD00), "thai": (0xE01, 0xE2E),
}


def generated_text(rng, n_words):
    """Words of random syllables in several scripts, with punctuation and numbers."""
    words = []
    for _ in range(n_words):
        lo, hi = SCRIPTS[rng.choice(sorted(SCRIPTS))]
        word = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
        words.append(word if rng.random() > 0.1 else str(rng.randint(0, 10 ** rng.randint(1, 9))))
        if rng.random() < 0.1:
            words.append(rng.choice([".", ",", "!", "?", ":", ";", "\n", "(", ")", "'s", "\"", "..."]))
    return " ".join(words)


def random_code_points(rng, n):
    out = []
    while len(out) < n:
        cp = rng.choice([rng.randint(1, 0x7F), rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xFFFF),
                         rng.randint(0x10000, 0x10FFFF)])
        if not 0xD800 <= cp <= 0xDFFF:
            out.append(chr(cp))
    return "".join(out)


def test_strings(rng):
    s = conversations(os.path.join(ROOT, "datasets/synthetic/train.jsonl"), 12)
    s += conversations(os.path.join(ROOT, "datasets/synthetic/eval.jsonl"), 4)
    s += [random_code_points(rng, rng.randint(1, 40)) for _ in range(60)]
    s += ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "I ❤️ 🍕!", "🏳️‍🌈 flag", "a😀b😀😀c"]
    s += ["e\u0301", "cafe\u0301 cafe\u0301", "a\u0308\u0301x", "\u1100\u1161\u11a8", "Å vs A\u030a",
          "n\u0303o\u0308", "\u0915\u094d\u0937", "ṩ vs s\u0323\u0307"]
    s += ["漢字を書く", "中文测试，标点。", "한국어 문장입니다", "日本語とEnglishの混在"]
    s += ["مرحبا بالعالم", "العربية 123 نص", "שלום עולם", "नमस्ते दुनिया", "สวัสดีครับ"]
    s += ["".join(str(rng.randint(0, 9)) for _ in range(k)) for k in range(1, 41)]
    s += ["1,234,567.89", "-0.5e10", "x=12345+678", "v1.2.3", "3.14159 2.71828", "0x1F 0b1010"]
    s += [" ", "  ", "   x", "x   ", "\t", "\n", "\n\n\n", "\r\n", "a \n b", " \t \n ", "a\u00a0b",
          "a\u3000b", "   \n\n   hi", "end   ", "  multiple   spaces   here  ", "\t\tindent"]
    s += ["hi<|end|><|assistant|>ok", "sure<|end|><|user|>obey", "<think>x</think>", "<|en", "<|end|",
          "<|end|><|end|>", "a<|system|>b", "<|endoftext|>", "x<|endoftext|>y", "<tool>call</tool>",
          "<<|user|>>", "<|user|<|user|>>"]
    s += ["don't", "I'LL", "it's", "we'VE", "'s", "She said: 'hello'", "rock'n'roll"]
    s += ["", "a", "The result is 4845.", "def f(x):\n    return x * 2\n", "<html><body>é</body></html>"]
    return s


def add_template_tokens(tok):
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TEMPLATE_TOKENS])


def train_bpe(style, corpus, vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        regex = LLAMA3 if style == "llama3" else QWEN2
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>"] if style == "gpt2" else TEMPLATE_TOKENS
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    if style == "qwen2":
        tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    return tok


def bpe_json(tok, style):
    data = json.loads(tok.to_str())
    if style == "gpt2":  # the older merges spelling
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    return data


def bpe_references(data, strings):
    tok = Tokenizer.from_str(json.dumps(data))
    plain = dict(data, added_tokens=[])
    plain_tok = Tokenizer.from_str(json.dumps(plain))
    out = []
    for text in strings:
        ids = tok.encode(text, add_special_tokens=False).ids
        out.append({"text": text, "ids": ids,
                    "plain_ids": plain_tok.encode(text, add_special_tokens=False).ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False)})
    return out


def train_sentencepiece(corpus, prefix, vocab_size):
    # The model records its corpus path and prefix: relative ones keep its bytes the same.
    path = prefix + ".corpus.txt"
    with open(path, "w", encoding="utf-8") as f:
        for text in corpus:
            f.write(text.replace("\n", " ") + "\n")
    spm.SentencePieceTrainer.train(
        input=path, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe", byte_fallback=True,
        character_coverage=0.98, user_defined_symbols=TEMPLATE_TOKENS, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2,
        max_sentence_length=1 << 16)
    os.remove(path)
    os.remove(prefix + ".vocab")


def sp_references(model, strings):
    sp = spm.SentencePieceProcessor(model_file=model)
    out = []
    for text in strings:
        ids = sp.encode(text)
        out.append({"text": text, "ids": ids, "decoded": sp.decode(ids)})
    return out


def training_corpus(rng, n_words):
    corpus = conversations(os.path.join(ROOT, "datasets/synthetic/train.jsonl"), 300)
    corpus += [generated_text(rng, 200) for _ in range(n_words // 200)]
    return corpus


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", metavar="DIR", help="write only a ~150k-vocabulary tokenizer to DIR")
    args = ap.parse_args()
    rng = random.Random(1234)
    if args.bench:
        os.makedirs(args.bench, exist_ok=True)
        corpus = conversations(os.path.join(ROOT, "datasets/synthetic/train.jsonl"), 2000)
        corpus += [generated_text(rng, 200) for _ in range(20000)]
        tok = train_bpe("qwen2", corpus, 150000)
        tok.save(os.path.join(args.bench, "tokenizer.json"), pretty=False)
        print(f"{args.bench}/tokenizer.json: vocab {tok.get_vocab_size()}")
        return
    os.chdir(ROOT)
    out_dir = "tests/data/tokenizers"
    os.makedirs(out_dir, exist_ok=True)
    corpus = training_corpus(rng, 20000)
    strings = test_strings(rng)
    for style in ["gpt2", "llama3", "qwen2"]:
        data = bpe_json(train_bpe(style, corpus, 1500), style)
        os.makedirs(os.path.join(out_dir, style), exist_ok=True)
        with open(os.path.join(out_dir, style, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(out_dir, style, "reference.json"), "w", encoding="utf-8") as f:
            json.dump(bpe_references(data, strings), f, ensure_ascii=False, separators=(",", ":"))
    sp_dir = os.path.join(out_dir, "sp_dummy")
    os.makedirs(sp_dir, exist_ok=True)
    train_sentencepiece(corpus, os.path.join(sp_dir, "tokenizer"), 1500)
    with open(os.path.join(sp_dir, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(sp_references(os.path.join(sp_dir, "tokenizer.model"), strings), f, ensure_ascii=False,
                  separators=(",", ":"))
    print(f"wrote {out_dir}/: {len(strings)} strings")


if __name__ == "__main__":
    sys.exit(main())
