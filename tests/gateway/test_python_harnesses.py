"""The REAL Python harnesses (mini-swe-agent, Open Interpreter and the OpenHands SDK agent, each in its own
venv under .harnesses/, `make harnesses`) against a running gateway with the scripted engine.

All speak OpenAI Chat through litellm and offer a shell-like tool; mini-swe-agent and OpenHands expect a
TOOL CALL to finish, so their runs differ from the npm harnesses' (tests/gateway/test_harnesses.py):

- a text run: the model answers with text — plain text for OpenHands and Open Interpreter (a reply
  without tool calls ends its run); for mini-swe-agent, text AND its bash tool running
  `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (its only way to finish): one captured call with token ids
  and logprobs, the answer on stdout, exit 0;
- a shell-tool run: the model first calls the harness's shell tool (a file appears in the workdir), then
  finishes (mini-swe-agent: the submit command; OpenHands: its `finish` tool with the answer; Open
  Interpreter: text; its tool is `execute` {language, code}): two captured calls, the second carries the
  tool's result and extends the first token by token;
- mini-swe-agent only: a reply WITHOUT a tool call is a format error: the harness drops that reply and
  calls again with a corrective user message appended (three in a row end the run), so the retry is a
  new branch of the session, not a continuation.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import common_pb2
from lodestar_gateway.node.harnesses import Launcher, make_harness
from lodestar_gateway.node.harnesses.mini_swe_agent import SUBMIT_MARKER
from tests.gateway.harness_runs import assert_captured, assert_shell_tool_run, describe, run_harness, text_of
from tests.gateway.stack import GatewayStack, assert_chain_extends

pytestmark = [pytest.mark.harness, pytest.mark.slow]


def _mini_finish(answer: str) -> dict[str, Any]:
    return {"text": answer, "tool_calls": [{"name": "bash", "arguments": {"command": f"echo {SUBMIT_MARKER}"}}]}


def _openhands_finish(answer: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "finish", "arguments": {"message": answer}}]}


def _text_reply(answer: str) -> dict[str, Any]:
    return {"text": answer}


@dataclass(frozen=True)
class Case:
    harness: str
    shell_tool: str
    shell_arguments: Callable[[str], dict[str, Any]]
    finish: Callable[[str], dict[str, Any]]
    """A reply that carries `answer` and ends the run after a tool call."""
    text_answer: Callable[[str], dict[str, Any]]
    """A first reply that carries `answer` and ends the run."""
    text_finish_reason: int


CASES = [
    Case(
        "mini_swe_agent",
        "bash",
        lambda command: {"command": command},
        _mini_finish,
        _mini_finish,
        common_pb2.FINISH_REASON_TOOL_CALLS,
    ),
    Case(
        "openhands",
        "terminal",
        lambda command: {"command": command, "summary": "Write the proof file"},
        _openhands_finish,
        _text_reply,
        common_pb2.FINISH_REASON_STOP,
    ),
    Case(
        "open_interpreter",
        "execute",
        lambda command: {"language": "shell", "code": command},
        _text_reply,
        _text_reply,
        common_pb2.FINISH_REASON_STOP,
    ),
]
PARAMS = [pytest.param(case, id=case.harness) for case in CASES]


@pytest.fixture(scope="module")
def launcher() -> Launcher:
    return Launcher(isolate_network=True)


NOT_INSTALLED = {
    "mini_swe_agent": "run `make harnesses`",
    "open_interpreter": "run `make harnesses`",
    "openhands": "run `make harnesses-openhands`: it needs Python >= 3.12 (on Debian 12: a debootstrapped Debian 13)",
}


def _require_installed(case: Case) -> None:
    harness = make_harness(case.harness)
    if not harness.is_installed():
        pytest.skip(f"{harness.binary} is not installed ({NOT_INSTALLED[case.harness]})")


@pytest.mark.parametrize("case", PARAMS)
async def test_text_run(case: Case, gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path) -> None:
    _require_installed(case)
    answer = f"Lodestar answer {secrets.token_hex(4)}."
    gateway_stack.set_script({"replies": [case.text_answer(answer)]})

    result, _, session_id = await run_harness(case.harness, gateway_stack, launcher, tmp_path, "Say hello.")
    calls = gateway_stack.calls(session_id)

    assert result.ok, describe(result, calls)
    assert answer in result.stdout, describe(result, calls)
    assert len(calls) == 1, describe(result, calls)
    (call,) = calls
    assert_captured(call, dialect=common_pb2.DIALECT_OPENAI_CHAT, shell_tool=case.shell_tool)
    assert call.finish_reason == case.text_finish_reason
    assert answer in text_of(call.completion)
    assert call.continued_from_sequence == -1
    assert gateway_stack.get_session(session_id).session.call_count == 1


@pytest.mark.parametrize("case", PARAMS)
async def test_shell_tool_run(case: Case, gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path) -> None:
    _require_installed(case)
    proof = f"proof-{secrets.token_hex(4)}"
    final = f"Created the file {secrets.token_hex(4)}."
    command = f"echo {proof} > proof.txt"
    tool_call = {"name": case.shell_tool, "arguments": case.shell_arguments(command)}
    gateway_stack.set_script({"replies": [{"tool_calls": [tool_call]}, case.finish(final)]})

    result, dirs, session_id = await run_harness(
        case.harness, gateway_stack, launcher, tmp_path, "Create proof.txt with the shell tool, then say what you did."
    )
    calls = gateway_stack.calls(session_id)

    first, second = assert_shell_tool_run(
        result,
        dirs,
        calls,
        proof=proof,
        final=final,
        dialect=common_pb2.DIALECT_OPENAI_CHAT,
        shell_tool=case.shell_tool,
    )
    tool_results = [m for m in second.messages if m.role == common_pb2.ROLE_TOOL]
    assert len(tool_results) == 1, "the second call must carry the shell tool's result"
    assert proof not in text_of(tool_results[0])  # `echo ... > file` prints nothing; the file holds it
    assert_chain_extends(calls)
    assert second.usage.continued_prompt_tokens >= len(first.prompt_token_ids) + len(first.completion_token_ids)


async def test_mini_swe_agent_answers_a_reply_without_tool_call_with_a_format_error(
    gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path
) -> None:
    (case,) = [case for case in CASES if case.harness == "mini_swe_agent"]
    _require_installed(case)
    # In call order: mini-swe-agent drops the reply it could not parse, so the second chat has no
    # assistant turn either (a turn-count script would answer it with the first reply again).
    gateway_stack.set_script(
        {"select": "sequence", "replies": [{"text": "Just text."}, case.finish("Now with the tool.")]}
    )

    result, dirs, session_id = await run_harness(case.harness, gateway_stack, launcher, tmp_path, "Say hello.")
    calls = gateway_stack.calls(session_id)

    assert result.ok, describe(result, calls)
    assert len(calls) == 2, describe(result, calls)
    first, second = calls
    assert first.finish_reason == common_pb2.FINISH_REASON_STOP
    assert [m.role for m in second.messages] == [m.role for m in first.messages] + [common_pb2.ROLE_USER]
    assert "No tool calls found" in text_of(second.messages[-1])
    assert "Just text." not in second.original_request_json  # the unparsable reply is not re-sent
    assert second.chain_start == common_pb2.CHAIN_START_BRANCH
    trajectory = json.loads((dirs.home / "trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"
