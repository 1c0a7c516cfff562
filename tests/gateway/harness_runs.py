"""What the real-harness gateway tests share: run one harness binary against a gateway session, describe a
failed run, check a captured call, read a message's text."""

from __future__ import annotations

from pathlib import Path

from lodestar.v1 import common_pb2
from lodestar_gateway.node.harnesses import GatewayEndpoint, HarnessResult, Launcher, RunDirs, make_harness
from tests.gateway.stack import GatewayStack

MODEL = "lodestar-tiny"
RUN_TIMEOUT_S = 240.0


async def run_harness(
    harness: str, stack: GatewayStack, launcher: Launcher, tmp_path: Path, prompt: str
) -> tuple[HarnessResult, RunDirs, str]:
    """Run `harness` on `prompt` in fresh directories under `tmp_path`, through a new gateway session:
    (result, directories, session id)."""
    session = stack.open_session(harness=harness)
    dirs = RunDirs.under(tmp_path / "run")
    endpoint = GatewayEndpoint(stack.http_base_url, session.key, MODEL)
    invocation = make_harness(harness).prepare(dirs, endpoint, prompt)
    result = await launcher.run(invocation, stack.http_base_url, timeout_s=RUN_TIMEOUT_S)
    return result, dirs, session.session_id


def describe(result: HarnessResult, calls: list[common_pb2.CallRecord]) -> str:
    return (
        f"rc={result.returncode} timed_out={result.timed_out} isolated={result.isolated} "
        f"calls={len(calls)}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"
    )


def assert_captured(call: common_pb2.CallRecord, *, dialect: int, shell_tool: str) -> None:
    """The call was captured token-faithfully through `dialect`, and the harness offered its shell tool."""
    assert call.dialect == dialect
    assert len(call.prompt_token_ids) > 0
    assert len(call.completion_token_ids) > 0
    assert len(call.completion_logprobs) == len(call.completion_token_ids)
    assert call.original_request_json
    assert shell_tool in {tool.name for tool in call.tools}, "the harness no longer offers its shell tool"


def text_of(message: common_pb2.ChatMessage) -> str:
    return "".join(part.text.text for part in message.content if part.HasField("text"))


def assert_shell_tool_run(
    result: HarnessResult,
    dirs: RunDirs,
    calls: list[common_pb2.CallRecord],
    *,
    proof: str,
    final: str,
    dialect: int,
    shell_tool: str,
) -> tuple[common_pb2.CallRecord, common_pb2.CallRecord]:
    """The harness ran its shell tool, which wrote `proof` into the workspace's proof.txt, then answered
    `final`: two calls captured, the first asking for the shell tool. Returns (first, second)."""
    assert result.ok, describe(result, calls)
    proof_file = dirs.workdir / "proof.txt"
    assert proof_file.is_file(), describe(result, calls)
    assert proof_file.read_text().strip() == proof
    assert final in result.stdout, describe(result, calls)
    assert len(calls) == 2, describe(result, calls)
    first, second = calls
    for call in calls:
        assert_captured(call, dialect=dialect, shell_tool=shell_tool)
    assert [tc.name for tc in first.completion.tool_calls] == [shell_tool]
    return first, second
