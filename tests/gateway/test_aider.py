"""The REAL aider (`aider-chat` in its own venv under .harnesses/, `make harnesses`) against a running gateway
with the scripted engine.

aider offers the model no tools: it edits files from the model's TEXT, in its edit format (for a model it
does not know, `whole`: a line with the file name, then the whole file in a fenced block), and runs one
exchange per `--message`. So its runs differ from the tool-calling harnesses':

- a text run: the scripted answer is on stdout; one captured call (OpenAI Chat, token ids and logprobs,
  no tools offered);
- an edit run: the model writes a new file in the `whole` format; aider creates it in the workdir (the
  proof), and the run is still one call.

aider's chat opens with example exchanges (assistant turns included): the scripts pick replies by call
order, not by assistant-turn count.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from lodestar.v1 import common_pb2
from lodestar_gateway.node.harnesses import Launcher, make_harness
from tests.gateway.harness_runs import describe, run_harness, text_of
from tests.gateway.stack import GatewayStack

pytestmark = [pytest.mark.harness, pytest.mark.slow]


@pytest.fixture(scope="module")
def launcher() -> Launcher:
    return Launcher(isolate_network=True)


@pytest.fixture(autouse=True)
def _installed() -> None:
    harness = make_harness("aider")
    if not harness.is_installed():
        pytest.fail(f"{harness.binary} is not installed: run `make harnesses`", pytrace=False)


def _assert_captured(call: common_pb2.CallRecord) -> None:
    assert call.dialect == common_pb2.DIALECT_OPENAI_CHAT
    assert len(call.prompt_token_ids) > 0
    assert len(call.completion_logprobs) == len(call.completion_token_ids) > 0
    assert not call.tools, "aider offers no tools"
    assert call.continued_from_sequence == -1


async def test_text_run(gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path) -> None:
    answer = f"Lodestar answer {secrets.token_hex(4)}."
    gateway_stack.set_script({"select": "sequence", "replies": [{"text": answer}]})

    result, _, session_id = await run_harness("aider", gateway_stack, launcher, tmp_path, "Say hello.")
    calls = gateway_stack.calls(session_id)

    assert result.ok, describe(result, calls)
    assert answer in result.stdout, describe(result, calls)
    assert len(calls) == 1, describe(result, calls)
    (call,) = calls
    _assert_captured(call)
    assert call.finish_reason == common_pb2.FINISH_REASON_STOP
    assert text_of(call.completion) == answer
    last = json.loads(call.original_request_json)["messages"][-1]["content"]
    assert last.startswith("Say hello."), last  # its format reminder follows


async def test_edit_run_writes_the_file(gateway_stack: GatewayStack, launcher: Launcher, tmp_path: Path) -> None:
    proof = f"proof-{secrets.token_hex(4)}"
    edit = f"I will create the file.\n\nproof.txt\n```\n{proof}\n```\n"
    gateway_stack.set_script({"select": "sequence", "replies": [{"text": edit}]})

    result, dirs, session_id = await run_harness(
        "aider", gateway_stack, launcher, tmp_path, f"Create proof.txt that holds the line {proof}."
    )
    calls = gateway_stack.calls(session_id)

    assert result.ok, describe(result, calls)
    proof_file = dirs.workdir / "proof.txt"
    assert proof_file.is_file(), describe(result, calls)
    assert proof_file.read_text().strip() == proof
    assert len(calls) == 1, describe(result, calls)
    _assert_captured(calls[0])
    assert sorted(p.name for p in dirs.workdir.iterdir()) == ["proof.txt"], "history files stay in the HOME"
