"""The REAL npm harness binaries (from .harnesses/, `make harnesses`) against a running gateway.

Each harness — Claude Code, Codex, Qwen Code, Gemini CLI, opencode, Continue CLI, Cline and Pi over each of
its four APIs — runs non-interactively through its launcher adapter (private HOME/TMPDIR/workdir, stdin=/dev/null, every
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
from pathlib import Path

import pytest

from lodestar.v1 import common_pb2
from lodestar_gateway.node.harnesses import Launcher
from tests.gateway.harness_cases import CASES, Case, require_installed
from tests.gateway.harness_runs import assert_captured, assert_shell_tool_run, describe, run_harness, text_of
from tests.gateway.stack import GatewayStack, assert_chain_extends

pytestmark = [pytest.mark.harness, pytest.mark.slow]


PARAMS = [pytest.param(case, id=case.harness) for case in CASES]


@pytest.fixture(scope="module")
def launcher() -> Launcher:
    return Launcher(isolate_network=True)


@pytest.mark.parametrize("case", PARAMS)
async def test_text_only_run(case: Case, gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path) -> None:
    require_installed(case)
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
    require_installed(case)
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
