"""The real harnesses the gateway harness tests run, one `Case` each (the dialect it speaks, its shell tool),
and the skip for a harness binary that is not installed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from lodestar.v1 import common_pb2
from lodestar_gateway.node.harnesses import make_harness


def _command_args(command: str) -> dict[str, Any]:
    return {"command": command}


@dataclass(frozen=True)
class Case:
    """One real harness as the tests drive it."""

    harness: str
    """Name for make_harness."""
    dialect: int
    """The CallRecord dialect the harness speaks."""
    shell_tool: str
    """The harness's own shell tool, as it offers it in the request's tool list."""
    tool_arguments: Callable[[str], dict[str, Any]] = _command_args
    """Arguments of that tool for a shell command line."""
    preamble_turns: int = 0
    """Assistant messages the harness puts in the chat before the model's first turn."""


CASES = [
    Case(
        "claude_code",
        common_pb2.DIALECT_ANTHROPIC_MESSAGES,
        "Bash",
        lambda command: {"command": command, "description": "Write the proof file"},
    ),
    Case("codex", common_pb2.DIALECT_OPENAI_RESPONSES, "exec_command", lambda command: {"cmd": command}),
    # Qwen Code opens every chat with a fixed user "context" turn and an assistant "Got it." reply.
    Case("qwen_code", common_pb2.DIALECT_OPENAI_CHAT, "run_shell_command", preamble_turns=1),
    Case("gemini_cli", common_pb2.DIALECT_GOOGLE_GENERATE_CONTENT, "run_shell_command"),
    Case("opencode", common_pb2.DIALECT_OPENAI_CHAT, "bash"),
    Case("continue_cli", common_pb2.DIALECT_OPENAI_CHAT, "Bash"),
    Case("cline", common_pb2.DIALECT_OPENAI_CHAT, "run_commands", lambda command: {"commands": [command]}),
    Case("pi:openai-completions", common_pb2.DIALECT_OPENAI_CHAT, "bash"),
    Case("pi:openai-responses", common_pb2.DIALECT_OPENAI_RESPONSES, "bash"),
    Case("pi:anthropic-messages", common_pb2.DIALECT_ANTHROPIC_MESSAGES, "bash"),
    Case("pi:google-generative-ai", common_pb2.DIALECT_GOOGLE_GENERATE_CONTENT, "bash"),
]
"""Every real harness (Pi once per API), for parametrizing."""


def require_installed(case: Case) -> None:
    """Skip the calling test when `case`'s harness binary is not installed."""
    harness = make_harness(case.harness)
    if not harness.is_installed():
        pytest.skip(f"harness binary {harness.binary} is not installed (run `make harnesses`)")
