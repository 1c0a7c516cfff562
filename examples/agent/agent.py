#!/usr/bin/env python3
"""A minimal coding agent for lodestar's `command` harness: the official `openai` SDK and one `shell` tool.

    python examples/agent/agent.py "Create hello.txt containing hi, then say done."

It follows the command harness contract (docs/nodes.md): the gateway endpoint and the session key come
from OPENAI_BASE_URL / OPENAI_API_KEY (LODESTAR_MODEL names the model), and it runs in the session's
workspace. Each turn it sends the conversation; every `shell` call the model makes is run with
`bash -c` in the working directory (timeout, output truncated) and its output goes back as the tool
result; the first reply without a tool call is the final answer, printed on stdout. It stops after
`--max-turns` model calls (exit 3). A failed model call exits 1 (the node reports such a session as an
infrastructure failure, not a reward).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from openai import OpenAI

SYSTEM_PROMPT = (
    "You are a coding agent. Working directory: {cwd}. Home: {home}. Use the `shell` tool to run commands. "
    "When the task is done, reply with the final answer only."
)
SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a bash command in the working directory; returns exit code, stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command line to run."}},
            "required": ["command"],
        },
    },
}
MAX_OUTPUT_CHARS = 8000


def run_shell(command: str, timeout_s: float) -> str:
    """Run `command` with bash in the working directory; a description of what happened."""
    try:
        done = subprocess.run(
            ["bash", "-c", command],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:g} s"
    output = f"exit code {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return output[-MAX_OUTPUT_CHARS:]


def tool_result(call: Any, timeout_s: float) -> str:
    if call.function.name != "shell":
        return f"unknown tool {call.function.name!r}; the only tool is `shell`"
    try:
        arguments = json.loads(call.function.arguments or "{}")
        command = str(arguments["command"])
    except (ValueError, KeyError, TypeError):
        return 'invalid arguments: expected {"command": "..."}'
    return run_shell(command, timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", help="the task")
    parser.add_argument("--max-turns", type=int, default=8, help="model calls before giving up")
    parser.add_argument("--shell-timeout", type=float, default=60.0, help="seconds per shell command")
    parser.add_argument("--model", default=os.environ.get("LODESTAR_MODEL", "lodestar"))
    parser.add_argument(
        "--temperature", type=float, default=None, help="temperature to ask for (a run's sampling policy overrides it)"
    )
    args = parser.parse_args(argv)

    sampling = {} if args.temperature is None else {"temperature": args.temperature}
    client = OpenAI(max_retries=2, timeout=600.0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    messages: list[dict[str, Any]] = [
        # Like real harnesses, the prompt names its paths: lodestar gives every session the same ones.
        {"role": "system", "content": SYSTEM_PROMPT.format(cwd=os.getcwd(), home=os.environ.get("HOME", "?"))},
        {"role": "user", "content": args.prompt},
    ]
    for _ in range(args.max_turns):
        try:
            reply = client.chat.completions.create(model=args.model, messages=messages, tools=[SHELL_TOOL], **sampling)  # type: ignore[arg-type]
        except Exception as error:  # the SDK's errors: connection, status, timeout
            print(f"model call failed: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
        message = reply.choices[0].message
        calls = message.tool_calls or []
        messages.append(message.model_dump(exclude_none=True))
        if not calls:
            print(message.content or "")
            return 0
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_result(call, args.shell_timeout)})
    print(f"no final answer after {args.max_turns} turns", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
