"""Real harnesses meeting a context overflow in the middle of a run (Claude Code and Codex): the second call
of a session no longer fits the served model's context, the gateway answers in the vendor's own words, and
the harness reacts (compacts, or stops cleanly with its own message) instead of crashing or retrying
forever. A conversation that follows a compaction is recorded as a new branch, never as a drift."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import common_pb2
from lodestar_gateway.node.harnesses import GatewayEndpoint, Launcher, RunDirs, make_harness
from lodestar_gateway.proxy import Unanswered
from tests.gateway.harness_cases import CASES, Case, require_installed
from tests.gateway.harness_runs import MODEL, RUN_TIMEOUT_S, describe
from tests.gateway.stack import GatewayStack

pytestmark = [pytest.mark.harness, pytest.mark.slow]

COMMAND = "sleep 3; seq 1 4000"
"""Slow enough for the test to shrink the context after the first call; its output overflows what is left."""
PARAMS = [pytest.param(case, id=case.harness) for case in CASES if case.harness in ("claude_code", "codex")]


@pytest.fixture(scope="module")
def launcher() -> Launcher:
    return Launcher(isolate_network=True)


async def _shrink_after_first_call(stack: GatewayStack, session_id: str, script: dict[str, Any]) -> int:
    """Wait for the session's first captured call, then serve a context that holds it plus 300 tokens."""
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        calls = await asyncio.to_thread(stack.calls, session_id)
        if calls:
            limit = len(calls[0].prompt_token_ids) + len(calls[0].completion_token_ids) + 300
            stack.set_script({**script, "context_length": limit})
            return limit
        await asyncio.sleep(0.1)
    raise AssertionError("the harness made no first call")


STOPPED_WITH = {
    "claude_code": "Prompt is too long",  # on stdout (-p mode stops; it does not compact a one-turn session)
    "codex": "ran out of room in the model's context window",  # on stderr
}


@pytest.mark.parametrize("case", PARAMS)
async def test_overflow_mid_run(case: Case, gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path) -> None:
    require_installed(case)
    tool_call = {"name": case.shell_tool, "arguments": case.tool_arguments(COMMAND)}
    script: dict[str, Any] = {"replies": [{"tool_calls": [tool_call]}], "default": {"text": "Summary: counted."}}
    gateway_stack.set_script(script)
    session = gateway_stack.open_session(harness=case.harness)
    dirs = RunDirs.under(tmp_path / "run")
    endpoint = GatewayEndpoint(gateway_stack.http_base_url, session.key, MODEL)
    invocation = make_harness(case.harness).prepare(dirs, endpoint, "Run the command and report the last line.")
    run = asyncio.ensure_future(launcher.run(invocation, gateway_stack.http_base_url, timeout_s=RUN_TIMEOUT_S))
    limit = await _shrink_after_first_call(gateway_stack, session.session_id, script)
    result = await run
    calls = gateway_stack.calls(session.session_id)
    assert gateway_stack.node is not None
    failed, message, refused, _ = gateway_stack.node.proxy.unanswered.get(session.session_id, Unanswered())
    # It stopped by itself, soon, saying why in its own words; no crash, no endless retries.
    assert not result.timed_out, describe(result, calls)
    assert result.returncode == 1, describe(result, calls)
    assert STOPPED_WITH[case.harness] in result.stdout + result.stderr, describe(result, calls)
    assert "panic" not in result.stderr.lower(), describe(result, calls)
    assert 1 <= failed <= 3, describe(result, calls)
    assert f"context length is {limit} tokens" in message
    assert refused, "an overflow is the agent's doing (scored by the node), not an outage"
    assert len(calls) == 1, describe(result, calls)


@pytest.mark.parametrize("case", [p for p in PARAMS if p.values[0].harness == "codex"])  # type: ignore[union-attr]
async def test_codex_compaction_is_recorded_as_branches(
    case: Case, gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path
) -> None:
    """Codex compacts when the usage we report passes `model_auto_compact_token_limit`: its summarizing call
    (no tools) and the conversation that follows (system + task + summary) are branches, not drifts."""
    require_installed(case)
    tool_call = {"name": case.shell_tool, "arguments": case.tool_arguments("seq 1 1500")}
    # In call order: the tool call, the compaction's summary, the final answer after the compaction.
    gateway_stack.set_script(
        {"select": "sequence", "replies": [{"tool_calls": [tool_call]}], "default": {"text": "Summary: counted."}}
    )
    session = gateway_stack.open_session(harness=case.harness)
    dirs = RunDirs.under(tmp_path / "run")
    endpoint = GatewayEndpoint(gateway_stack.http_base_url, session.key, MODEL)
    invocation = make_harness(case.harness).prepare(dirs, endpoint, "Run the command and report the last line.")
    (config,) = [path for path in invocation.config_files if path.name == "config.toml"]
    # Above the first call's prompt (~13K tokens of instructions and tools), below it plus the tool's output.
    config.write_text(f"model_auto_compact_token_limit = {COMPACT_LIMIT}\n" + config.read_text())
    result = await launcher.run(invocation, gateway_stack.http_base_url, timeout_s=RUN_TIMEOUT_S)
    calls = gateway_stack.calls(session.session_id)
    starts = [common_pb2.ChainStart.Name(call.chain_start).removeprefix("CHAIN_START_") for call in calls]
    assert result.ok, describe(result, calls)
    assert "Summary: counted." in result.stdout, describe(result, calls)
    assert len(calls[0].prompt_token_ids) < COMPACT_LIMIT, starts
    # Codex compacts as soon as the tool's output would take it past the limit, before the next model call.
    assert len(calls) == 3, starts
    first, summarize, after = calls
    assert [tool.name for tool in first.completion.tool_calls] == [case.shell_tool]
    assert not summarize.tools  # the compaction request runs without tools
    assert "COMPACTION" in _last_text(summarize)
    assert "summary" in _last_text(after).lower()
    assert starts == ["FIRST", "BRANCH", "BRANCH"]
    assert gateway_stack.node is not None
    assert gateway_stack.node.proxy.chain_breaks == 0


COMPACT_LIMIT = 14000


def _last_text(call: common_pb2.CallRecord) -> str:
    return "".join(part.text.text for part in call.messages[-1].content if part.HasField("text"))
