#!/usr/bin/env python3
"""Chat-template fixtures for tests/test_templates.c (DESIGN.md §2, §8).

For every template in tests/data/templates/*.jinja (the official texts, see the README there)
writes tests/data/templates/NAME/:
  tokenizer.json         a fixture BPE tokenizer of tests/data/tokenizers with the family's
                         control tokens added (the model's own cannot be downloaded here)
  tokenizer_config.json  chat_template (the .jinja text), bos/eos tokens: a model folder
  expected.json          for a set of conversations (the shipped data and hand-made cases),
                         each turn's inference view as transformers' apply_chat_template
                         renders it: "text", "trained_from" (the byte where the trained reply
                         starts) and "ids" (the reference tokenizer on the whole text).

The view of turn t is messages[0..t]: earlier replies rendered as the template renders
history (their reasoning dropped), the generation prompt, then the reply as the model emits
it. Rules per template (DESIGN.md §8):
  qwen3        the template's own rendering of the last reply, "<|im_end|>" included (the
               "\\n" after it is the next prompt's); history stripped by the template.
  deepseek_r1  the template strips the think block even from the last reply: the view is the
               generation prompt "<｜Assistant｜><think>\\n" + reasoning + "\\n</think>\\n\\n" +
               answer + eos; the trained part starts at "<think>\\n" (onepass trains it: the
               segment is shared with the history view, where it is absent). History replies
               are handed to the template as the model emitted them ("<think>\\n" + reasoning +
               "\\n</think>\\n\\n" + answer): it keeps "\\n\\n" + answer.
  chatml, qwen2.5, smollm2, llama3, zephyr
               no reasoning in the template: the last reply's content is
               "<think>\\n" + reasoning + "\\n</think>\\n\\n" + answer (without reasoning: the
               answer), history replies the answer alone. llama3 renders its date lines with
               the template's default date_string.
  onepass      onepass.jinja (written for these fixtures).
Tool use (qwen3 and onepass only, the others refuse it): a few conversations of
datasets/tool_use and hand-made ones, the tools handed to the template. Within a turn
(after the last user message) the template decides which earlier replies keep their
reasoning: Qwen3 those that have some, onepass every one with a reasoning string.

  /tmp/hfvenv/bin/python scripts/make_template_fixtures.py
Needs transformers, tokenizers, jinja2; CI never runs it (the outputs are committed).
"""
import json
import os

from tokenizers import AddedToken, Tokenizer
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests/data/templates")

# name: (fixture tokenizer style, added control tokens, bos, eos, end of turn, after turn)
TEMPLATES = {
    "qwen3": ("qwen2", ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                        "<tool_response>", "</tool_response>"], None, "<|im_end|>", "<|im_end|>", "\n"),
    "deepseek_r1": ("qwen2", ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                              "<｜Assistant｜>", "<think>", "</think>"],
                    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ""),
    "chatml": ("qwen2", ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|im_end|>", "\n"),
    "qwen2.5": ("qwen2", ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|im_end|>", "\n"),
    "smollm2": ("gpt2", ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|im_end|>", "\n"),
    "llama3": ("llama3", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>", ""),
    "zephyr": ("gpt2", ["<s>", "</s>"], "<s>", "</s>", "</s>", "\n"),
    "onepass": ("qwen2", [], None, "<|end|>", "<|end|>", ""),
}
THINK_AS_TEXT = {"chatml", "qwen2.5", "smollm2", "llama3", "zephyr"}
TOOLS = {"qwen3", "onepass"}  # the templates that render tool use (the others refuse it)


def split_inline_think(text):
    """data/conversation.c's split of "<think>R</think>A" (ASCII whitespace around dropped)."""
    ws = " \t\n\r"
    p = text.lstrip(ws)
    if not p.startswith("<think>"):
        return None, text
    r, a = p[len("<think>"):].split("</think>", 1)
    return r.strip(ws), a.lstrip(ws)


def message(m, role=None):
    out = {"role": role or m["role"], "content": m.get("content") or ""}
    for key in ["tool_calls", "name", "tool_call_id"]:
        if key in m:
            out[key] = m[key]
    if out["role"] == "assistant":
        if "reasoning_content" in m:  # "" and null: no reasoning (data/conversation.c)
            if m["reasoning_content"]:
                out["reasoning_content"] = m["reasoning_content"]
        else:  # an inline "<think></think>" is an empty reasoning
            r, out["content"] = split_inline_think(out["content"])
            if r is not None:
                out["reasoning_content"] = r
    return out


SHAREGPT = {"system": "system", "human": "user", "gpt": "assistant"}


def normalized(line):
    """A JSONL line in the "messages" (or "prompt"/"completions") form with reasoning_content."""
    d = json.loads(line)
    if "conversations" in d:
        return {"messages": [message({"role": SHAREGPT[t["from"]], "content": t["value"]})
                             for t in d["conversations"]]}
    tools = {"tools": d["tools"]} if "tools" in d else {}
    if "completion" in d:  # TRL prompt/completion: one conversation
        return {**tools, "messages": [message(m) for m in d["prompt"] + d["completion"]]}
    if "prompt" in d:
        return {**tools, "prompt": [message(m) for m in d["prompt"]],
                "completions": [message(m, "assistant") for m in d["completions"]]}
    return {**tools, "messages": [message(m) for m in d["messages"]]}


HAND_MADE = [
    {"messages": [
        {"role": "system", "content": "You are terse.  "},
        {"role": "user", "content": "  What is 6 times 7?\n"},
        {"role": "assistant", "content": "42.", "reasoning_content": "6*7 = 42."},
        {"role": "user", "content": "And halved?"},
        {"role": "assistant", "content": "21. ", "reasoning_content": "42/2 = 21."}]},
    {"messages": [  # empty reasoning, then none
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "<think></think>Hi!"},
        {"role": "user", "content": "Again, no thinking."},
        {"role": "assistant", "content": "Hi again!"},
        {"role": "user", "content": "Once more, with feeling."},
        {"role": "assistant", "content": "Hi, with feeling!", "reasoning_content": "Be warm."}]},
    {"messages": [  # newlines around the reasoning, Unicode, an empty answer
        {"role": "user", "content": "日本語で答えて 😀"},
        {"role": "assistant", "content": "はい、わかりました。", "reasoning_content": "\nThe user wants Japanese.\n\n"},
        {"role": "user", "content": "Nothing more to say?"},
        {"role": "assistant", "content": "", "reasoning_content": "Say nothing."}]},
    {"messages": [  # no reasoning anywhere, a leading space in an answer
        {"role": "user", "content": "Count: 1, 2, 3"},
        {"role": "assistant", "content": " 4, 5, 6"},
        {"role": "user", "content": "def f(x):\n    return x"},
        {"role": "assistant", "content": "It returns x."}]},
]


CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "a op b",
                                               "parameters": {"type": "object", "required": ["op", "a", "b"]}}}
TOOL_MADE = [
    {"tools": [CALCULATOR, {"type": "function", "function": {"name": "größe", "parameters": {}}}],
     "messages": [  # a system message with tools, a reply without reasoning calling two tools
        # (arguments as a JSON string not in json.dumps form: Qwen3 writes it as given), two results
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "3 times 4, and the size of 'ab'?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "calculator",
                                                          "arguments": "{\"op\":\"mul\", \"a\":3,\"b\":4}"}},
            {"type": "function", "function": {"name": "größe", "arguments": {"text": "ab ü"}}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "12"},
        {"role": "tool", "name": "größe", "content": "2"},
        {"role": "assistant", "content": "12 and 2.", "reasoning_content": "Both came back."}]},
    {"tools": [CALCULATOR],
     "messages": [  # two tool rounds in one turn, each reply reasoning; then a turn without tools
        {"role": "user", "content": "(2 + 3) * 4?"},
        {"role": "assistant", "content": "", "reasoning_content": "First the sum.", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"op": "add", "a": 2, "b": 3}}}]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "Now the product.", "reasoning_content": "\nThen 5 * 4.\n", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"op": "mul", "a": 5, "b": 4}}}]},
        {"role": "tool", "content": "20"},
        {"role": "assistant", "content": "20.", "reasoning_content": "Done."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You're welcome."}]},
]


def cases(name):
    lines = []
    sources = [("datasets/synthetic/train.jsonl", 3), ("datasets/synthetic/eval.jsonl", 2),
               ("datasets/synthetic/shared_prefix.jsonl", 2), ("tests/data/all_formats.jsonl", 99)]
    if name in TOOLS:  # lines 1, 2 (object and string arguments), 6 (TRL), 9 (two calls, two turns)
        sources += [("datasets/tool_use/train.jsonl", [0, 1, 5, 8])]
    for path, n in sources:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            all_lines = f.read().splitlines()
            picked = all_lines[:n] if isinstance(n, int) else [all_lines[i] for i in n]
            lines += [normalized(l) for l in picked if l.strip()]
    made = HAND_MADE + (TOOL_MADE if name in TOOLS else [])
    return lines + [normalized(json.dumps(s)) for s in made]


def canonical_arguments(call):
    """onepass renders tool-call arguments given as a JSON string in json.dumps form."""
    call = json.loads(json.dumps(call))
    fn = call.get("function", call)
    if isinstance(fn["arguments"], str):
        fn["arguments"] = json.loads(fn["arguments"])
    return call


def template_messages(name, msgs, last_is_reply):
    """The messages handed to the official template (the last one is the reply when last_is_reply)."""
    out = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            out.append({"role": m["role"], "content": m["content"]})
            continue
        r = m.get("reasoning_content")
        final = last_is_reply and i == len(msgs) - 1
        if name in THINK_AS_TEXT:
            think = "<think>\n" + r + "\n</think>\n\n" if final and r is not None else ""
            out.append({"role": "assistant", "content": think + m["content"]})
        elif name == "deepseek_r1":  # the model's output; the template strips it itself
            out.append({"role": "assistant", "content": "<think>\n" + (r or "") + "\n</think>\n\n" + m["content"]})
        elif name == "onepass" and "tool_calls" in m:
            out.append({**m, "tool_calls": [canonical_arguments(c) for c in m["tool_calls"]]})
        else:
            out.append(dict(m))
    return out


def view(tok, name, msgs, tools):
    """(text, trained_from) of the inference view whose last message is the trained reply."""
    _, _, _, eos, eot, after = TEMPLATES[name]
    gen = tok.apply_chat_template(template_messages(name, msgs[:-1], False), tokenize=False,
                                  add_generation_prompt=True, tools=tools)
    reply = msgs[-1]
    if name == "deepseek_r1":
        assert gen.endswith("<｜Assistant｜><think>\n"), gen
        # What the template renders for the reply (think stripped), for the record.
        full = tok.apply_chat_template(template_messages(name, msgs, True), tokenize=False)
        assert full == gen[:-len("<think>\n")] + "\n\n" + reply["content"] + eot, (full, gen)
        text = gen + (reply.get("reasoning_content") or "") + "\n</think>\n\n" + reply["content"] + eot
        return text, len(gen.encode()) - len("<think>\n")
    full = tok.apply_chat_template(template_messages(name, msgs, True), tokenize=False, tools=tools)
    assert full.startswith(gen) and full.endswith(eot + after), (gen, full)
    return full[:len(full) - len(after)], len(gen.encode())


def jsonl_form(sample):
    """The sample as a JSONL line data/conversation.c reads back to the same messages: an
    empty reasoning inline ("reasoning_content": "" means none)."""
    def line_message(m):
        if m.get("reasoning_content") == "":
            return {"role": m["role"], "content": "<think></think>" + m["content"]}
        return m
    return {k: v if k == "tools" else [line_message(m) for m in v] for k, v in sample.items()}


def sample_views(sample):
    if "messages" in sample:
        msgs = sample["messages"]
        return [msgs[:i + 1] for i, m in enumerate(msgs) if m["role"] == "assistant"]
    return [sample["prompt"] + [c] for c in sample["completions"]]


def add_whitespace_merges(model):
    """Merges of newline and space pairs, as real vocabularies have: a segment boundary inside
    such a run ("assistant\\n" | "\\nA") then changes the ids, and onepass must refuse it."""
    for pair in [("Ċ", "Ċ"), ("Ġ", "Ġ")]:
        if pair[0] + pair[1] in model["vocab"]:
            continue
        model["vocab"][pair[0] + pair[1]] = len(model["vocab"])
        spaced = model["merges"] and isinstance(model["merges"][0], str)
        model["merges"].append(" ".join(pair) if spaced else list(pair))


def write_json(path, data):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")


def main():
    for name, (style, controls, bos, eos, _, _) in TEMPLATES.items():
        samples = cases(name)
        folder = os.path.join(OUT, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(ROOT, "tests/data/tokenizers", style, "tokenizer.json"), encoding="utf-8") as f:
            data = json.load(f)
        if name != "onepass":  # the family's tokens only (their strings stay ordinary pieces)
            data["added_tokens"] = []
            add_whitespace_merges(data["model"])
        tok = Tokenizer.from_str(json.dumps(data))
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in controls])
        with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tok.to_str() + "\n")
        with open(os.path.join(OUT, name + ".jinja"), encoding="utf-8") as f:
            chat_template = f.read()
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos}
        if bos:
            config["bos_token"] = bos
        if name != "onepass":  # onepass: no chat_template, the default
            config["chat_template"] = chat_template
        write_json(os.path.join(folder, "tokenizer_config.json"), config)
        hf = AutoTokenizer.from_pretrained(folder)
        hf.chat_template = chat_template
        out = []
        for sample in samples:
            views = []
            for msgs in sample_views(sample):
                text, trained_from = view(hf, name, msgs, sample.get("tools"))
                views.append({"text": text, "trained_from": trained_from,
                              "ids": tok.encode(text, add_special_tokens=False).ids})
            out.append({"line": json.dumps(jsonl_form(sample), ensure_ascii=False), "views": views})
        write_json(os.path.join(folder, "expected.json"), {"template": name, "cases": out})
        print(name, sum(len(c["views"]) for c in out), "views")


if __name__ == "__main__":
    main()
