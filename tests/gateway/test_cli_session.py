"""`lodestar session open/show/close --gateway HOST:PORT` against a running gateway."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.cases import VALID
from tests.gateway.http import post
from tests.gateway.stack import GatewayStack

REPO = Path(__file__).resolve().parents[2]


def lodestar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_session_open_prints_a_working_key(gateway_stack: GatewayStack) -> None:
    opened = lodestar("session", "open", "--gateway", gateway_stack.grpc_address, "--label", "task=t1")
    assert opened.returncode == 0, opened.stderr
    key = opened.stdout.strip()
    assert key.startswith("lsk-")
    assert gateway_stack.http_base_url in opened.stderr
    path, body = VALID["anthropic"]
    assert post(gateway_stack.http_base_url, path, body, key=key).status == 200
    as_json = json.loads(lodestar("session", "open", "--gateway", gateway_stack.grpc_address, "--json").stdout)
    assert as_json["http_base_url"] == gateway_stack.http_base_url
    session_id = opened.stderr.split()[1]
    shown = lodestar("session", "show", session_id, "--gateway", gateway_stack.grpc_address)
    assert "1 calls" in shown.stdout
    assert "#0 prompt=" in shown.stdout
    assert lodestar("session", "show", key, "--gateway", gateway_stack.grpc_address).stdout == shown.stdout
    closed = lodestar("session", "close", session_id, "--gateway", gateway_stack.grpc_address)
    assert closed.returncode == 0
    assert post(gateway_stack.http_base_url, path, body, key=key).status == 401
    missing = lodestar("session", "close", "ses_missing", "--gateway", gateway_stack.grpc_address)
    assert missing.returncode == 2
    assert "unknown session" in missing.stderr


@pytest.mark.slow
def test_session_show_calls_and_json(gateway_stack: GatewayStack, tiny_model_dir: Path) -> None:
    gateway_stack.set_script({"replies": [{"text": "First answer."}, {"text": "Second answer."}]})
    key = lodestar("session", "open", "--gateway", gateway_stack.grpc_address).stdout.strip()
    messages: list[dict[str, str]] = [{"role": "user", "content": "question one"}]
    reply = post(gateway_stack.http_base_url, "/v1/chat/completions", {"model": "m", "messages": messages}, key=key)
    messages += [reply.json()["choices"][0]["message"], {"role": "user", "content": "question two"}]
    assert post(gateway_stack.http_base_url, "/v1/chat/completions", {"model": "m", "messages": messages}, key=key)
    gateway = ("--gateway", gateway_stack.grpc_address)
    detail = lodestar("session", "show", key, "--calls", *gateway)
    assert detail.returncode == 0, detail.stderr
    lines = detail.stdout.splitlines()
    assert lines[1].startswith("#0 openai_chat policy=0 finish=stop new chain (first)")
    assert "[user] question one" in lines[2]
    assert "'First answer.'" in lines[3]
    assert lines[4] == "  sampling: temperature=1 top_p=1 top_k=0 (asked: -)"  # no policy, nothing asked
    assert lines[5].startswith("  logprobs: ")
    assert lines[6].startswith("#1 openai_chat policy=0 finish=stop continues #0 (")
    decoded = lodestar("session", "show", key, "--calls", "--model", str(tiny_model_dir), *gateway)
    assert "Second answer." in decoded.stdout
    assert "<|im_start|>assistant\\n'" in decoded.stdout  # the prompt's tail exactly as the model saw it
    assert "'.' 0.000 | '<|im_end|>' 0.000" in decoded.stdout  # each sampled token with its logprob
    as_json = json.loads(lodestar("session", "show", key, "--json", *gateway).stdout)
    assert [call.get("sequence", 0) for call in as_json["calls"]] == [0, 1]
    assert [call.get("continuedFromSequence", 0) for call in as_json["calls"]] == [-1, 0]  # 0: omitted default
    assert as_json["calls"][1]["chainStart"] == "CHAIN_START_CONTINUED"
    assert "sessionKey" not in as_json["session"]
