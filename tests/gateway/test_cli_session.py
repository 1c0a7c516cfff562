"""`lodestar session open/show/close --gateway HOST:PORT` against a running gateway."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.gateway.cases import VALID
from tests.gateway.http import post
from tests.gateway.stack import GatewayStack

REPO = Path(__file__).resolve().parents[2]


def lodestar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodestar.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


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
    closed = lodestar("session", "close", session_id, "--gateway", gateway_stack.grpc_address)
    assert closed.returncode == 0
    assert post(gateway_stack.http_base_url, path, body, key=key).status == 401
    missing = lodestar("session", "close", "ses_missing", "--gateway", gateway_stack.grpc_address)
    assert missing.returncode == 2
    assert "unknown session" in missing.stderr
