"""The REAL npm harness binaries (from .harnesses/, `make harnesses`) against a running gateway.

Each harness — Claude Code, Codex, Qwen Code, Gemini CLI, opencode and Pi over each of its four APIs — runs
non-interactively through its launcher adapter (private HOME/TMPDIR/workdir, stdin=/dev/null, every
telemetry/update switch off, a loopback-only network namespace when available) with a session key from
GatewayService.OpenSession, against the scripted inference engine:

- a text-only run: the scripted answer is on stdout and GetSession shows exactly one captured call with
  token ids and logprobs;
- a tool run: the engine first returns ONE call of the harness's own shell tool (whose effect, a file in
  the workdir, is checked), then a final answer (on stdout); the two captured calls carry token ids and
  the second one's prompt extends the first one's prompt + sampled ids token by token.

Exit codes alone prove little (Pi and Gemini CLI exit 0 after a failed stream): every test checks stdout,
the workdir and the captured calls.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import common_pb2
from services.gateway.node.harnesses import Launcher, make_harness
from tests.gateway.harness_runs import assert_captured, assert_shell_tool_run, describe, run_harness, text_of
from tests.gateway.stack import GatewayStack, assert_chain_extends

pytestmark = [pytest.mark.harness, pytest.mark.slow]


def _command_args(command: str) -> dict[str, Any]:
    return {"command": command}


@dataclass(frozen=True)
class Case:
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
        "claude-code",
        common_pb2.DIALECT_ANTHROPIC_MESSAGES,
        "Bash",
        lambda command: {"command": command, "description": "Write the proof file"},
    ),
    Case("codex", common_pb2.DIALECT_OPENAI_RESPONSES, "exec_command", lambda command: {"cmd": command}),
    # Qwen Code opens every chat with a fixed user "context" turn and an assistant "Got it." reply.
    Case("qwen-code", common_pb2.DIALECT_OPENAI_CHAT, "run_shell_command", preamble_turns=1),
    Case("gemini-cli", common_pb2.DIALECT_GOOGLE_GENERATE_CONTENT, "run_shell_command"),
    Case("opencode", common_pb2.DIALECT_OPENAI_CHAT, "bash"),
    Case("pi:openai-completions", common_pb2.DIALECT_OPENAI_CHAT, "bash"),
    Case("pi:openai-responses", common_pb2.DIALECT_OPENAI_RESPONSES, "bash"),
    Case("pi:anthropic-messages", common_pb2.DIALECT_ANTHROPIC_MESSAGES, "bash"),
    Case("pi:google-generative-ai", common_pb2.DIALECT_GOOGLE_GENERATE_CONTENT, "bash"),
]
PARAMS = [pytest.param(case, id=case.harness) for case in CASES]


@pytest.fixture(scope="module")
def launcher() -> Launcher:
    return Launcher(isolate_network=True)


def _require_installed(case: Case) -> None:
    harness = make_harness(case.harness)
    if not harness.is_installed():
        pytest.skip(f"harness binary {harness.binary} is not installed (run `make harnesses`)")


@pytest.mark.parametrize("case", PARAMS)
async def test_text_only_run(case: Case, gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path) -> None:
    _require_installed(case)
    answer = f"Lodestar answer {secrets.token_hex(4)}."
    gateway_stack.set_script({"replies": [{"text": "(unused preamble)"}] * case.preamble_turns + [{"text": answer}]})

    result, _, session_id = await run_harness(case.harness, gateway_stack, launcher, tmp_path, "Say hello.")
    calls = gateway_stack.calls(session_id)

    assert result.ok, describe(result, calls)
    assert answer in result.stdout, describe(result, calls)
    assert len(calls) == 1, describe(result, calls)
    (call,) = calls
    assert_captured(call, dialect=case.dialect, shell_tool=case.shell_tool)
    assert call.finish_reason == common_pb2.FINISH_REASON_STOP
    assert text_of(call.completion) == answer
    assert call.continued_from_sequence == -1
    assert gateway_stack.get_session(session_id).session.call_count == 1


@pytest.mark.parametrize("case", PARAMS)
async def test_shell_tool_run(case: Case, gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path) -> None:
    _require_installed(case)
    proof = f"proof-{secrets.token_hex(4)}"
    final = f"Created the file {secrets.token_hex(4)}."
    command = f"echo {proof} > proof.txt"
    tool_call = {"name": case.shell_tool, "arguments": case.tool_arguments(command)}
    gateway_stack.set_script(
        {
            "replies": [{"text": "(unused preamble)"}] * case.preamble_turns
            + [{"tool_calls": [tool_call]}, {"text": final}]
        }
    )

    result, dirs, session_id = await run_harness(
        case.harness, gateway_stack, launcher, tmp_path, "Create proof.txt with the shell tool, then say what you did."
    )
    calls = gateway_stack.calls(session_id)

    first, second = assert_shell_tool_run(
        result, dirs, calls, proof=proof, final=final, dialect=case.dialect, shell_tool=case.shell_tool
    )
    assert first.finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
    assert second.finish_reason == common_pb2.FINISH_REASON_STOP
    assert text_of(second.completion) == final
    tool_results = [m for m in second.messages if m.role == common_pb2.ROLE_TOOL]
    assert len(tool_results) == 1, "the second call must carry the shell tool's result"
    assert_chain_extends(calls)
    assert second.usage.continued_prompt_tokens >= len(first.prompt_token_ids) + len(first.completion_token_ids)
