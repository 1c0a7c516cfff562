#!/usr/bin/env python3
"""The quickstart agent: two model calls per session through the OpenAI Chat API, standard library only.

    python examples/quickstart/agent.py "Write a short line ..."

It follows the `command` harness contract (docs/nodes.md): OPENAI_BASE_URL and OPENAI_API_KEY (the session
key) come from the environment. It asks the task, then sends a follow-up turn on the same conversation
("Again, better."), so every session has two calls and the second extends the first token by token: the
trainer merges them into one sequence (prefix merging). The final answer is the last reply (`--turns 1`: the
first; examples/smollm2-capitals asks once). A failed
model call exits 1 (an infrastructure failure, not a reward). The standard library keeps its start fast
(no SDK import): sessions are short and many.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

FOLLOW_UP = "Again, better."


def chat(messages: list[dict[str, Any]], *, model: str, max_tokens: int, timeout_s: float) -> str:
    """One non-streaming chat completion; the assistant's text."""
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        answer = json.loads(reply.read())
    return str(answer["choices"][0]["message"].get("content") or "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", help="the task")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply")
    parser.add_argument("--turns", type=int, default=2, help="model calls: the task, then follow-ups")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per model call")
    parser.add_argument("--model", default=os.environ.get("LODESTAR_MODEL", "lodestar"))
    args = parser.parse_args(argv)
    messages: list[dict[str, Any]] = [{"role": "user", "content": args.prompt}]
    text = ""
    try:
        for turn in range(args.turns):
            if turn:
                messages.append({"role": "user", "content": FOLLOW_UP})
            text = chat(messages, model=args.model, max_tokens=args.max_tokens, timeout_s=args.timeout)
            messages.append({"role": "assistant", "content": text})
    except (OSError, urllib.error.URLError, ValueError, KeyError) as error:
        print(f"model call failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
