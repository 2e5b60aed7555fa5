#!/usr/bin/env python3
"""Writes datasets/tool_use/{train,eval}.jsonl: calculator conversations with tool calls.

Deterministic (random.Random(seed) integer draws are stable across Python 3 versions);
run from the repository root:  python3 scripts/make_tool_use_data.py
Each conversation has 1-3 user turns. A turn either asks for a product or sum that
the assistant computes with the `calculator` tool (reasoning, a tool call, the tool's
result, reasoning again, the answer: two assistant messages in one user turn), asks
for two results at once (two calls, two results), or asks a question answered
directly. Formats are mixed: OpenAI `messages` with `tool_calls` (arguments as an
object or as a JSON string) and `tools`, and TRL's conversational prompt/completion.
"""
import json
import random

TOOLS = [{"type": "function", "function": {
    "name": "calculator",
    "description": "a op b: add, sub or mul",
    "parameters": {"type": "object", "required": ["op", "a", "b"]}}}]
OPS = {"add": ("the sum of {a} and {b}", lambda a, b: a + b),
       "sub": ("{a} minus {b}", lambda a, b: a - b),
       "mul": ("the product of {a} and {b}", lambda a, b: a * b)}
SYSTEM = "You can use tools. Think before you answer."
DIRECT = [("What is the calculator tool for?", "It evaluates sums, differences and products.",
           "The user asks about the tool, no call needed."),
          ("Thanks!", "You are welcome.", "")]


def call(rng, op, a, b, n):
    args = {"op": op, "a": a, "b": b}
    # Arguments as an object or as a JSON string, as datasets have both.
    return {"id": f"call_{n}", "type": "function", "function": {
        "name": "calculator", "arguments": args if rng.random() < 0.5 else json.dumps(args)}}


def tool_turn(rng, n_calls, counter):
    jobs = []
    for _ in range(n_calls):
        op = rng.choice(sorted(OPS))
        a, b = rng.randint(100, 9999), rng.randint(2, 999)
        jobs.append((op, a, b, OPS[op][1](a, b)))
    asks = " and ".join(OPS[op][0].format(a=a, b=b) for op, a, b, _ in jobs)
    user = {"role": "user", "content": f"What is {asks}?"}
    calls = [call(rng, op, a, b, counter + i) for i, (op, a, b, _) in enumerate(jobs)]
    first = {"role": "assistant", "content": "", "tool_calls": calls,
             "reasoning_content": f"This needs {n_calls} calculator call{'s' if n_calls > 1 else ''}."}
    results = [{"role": "tool", "name": "calculator", "tool_call_id": c["id"], "content": str(r)}
               for c, (_, _, _, r) in zip(calls, jobs)]
    said = " and ".join(str(r) for *_, r in jobs)
    final = {"role": "assistant", "content": f"The result{'s are' if n_calls > 1 else ' is'} {said}.",
             "reasoning_content": f"The calculator returned {said}."}
    return [user, first, *results, final], counter + n_calls


def conversation(rng):
    msgs, counter = [], 0
    for t in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.2 and t > 0:
            q, a, r = rng.choice(DIRECT)
            reply = {"role": "assistant", "content": a}
            if r:
                reply["reasoning_content"] = r
            msgs += [{"role": "user", "content": q}, reply]
        else:
            turn, counter = tool_turn(rng, 2 if kind > 0.8 else 1, counter)
            msgs += turn
    if rng.random() < 0.3:
        msgs.insert(0, {"role": "system", "content": SYSTEM})
    # TRL prompt/completion for a quarter of them: the last user turn is the completion.
    if rng.random() < 0.25:
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        return {"tools": TOOLS, "prompt": msgs[:last_user + 1], "completion": msgs[last_user + 1:]}
    return {"tools": TOOLS, "messages": msgs}


def write(path, seed, n):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps(conversation(rng), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    write("datasets/tool_use/train.jsonl", 1234, 300)
    write("datasets/tool_use/eval.jsonl", 5678, 40)
