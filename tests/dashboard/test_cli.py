"""`lodestar dashboard` and `lodestar up --dashboard` as real processes: they print the address, serve the
rollout service's runs, refuse a bind beyond loopback without a token, and stop cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.dashboard.stack import DashboardStack
from tests.e2e.up_support import read_until

URL = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/)")


def _lodestar(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "lodestar_app.cli.main", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _address(process: subprocess.Popen[str], timeout: float) -> str:
    try:
        output = read_until(process, "dashboard: http", timeout)
    except AssertionError:
        process.kill()
        raise
    match = URL.search(output)
    assert match is not None, output
    return match.group(1)


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.loads(reply.read())


def _stop(process: subprocess.Popen[str], timeout: float) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.slow
def test_dashboard_command(stack: DashboardStack) -> None:
    assert stack.run is not None
    process = _lodestar("dashboard", "--rollout", stack.rollout_address, "--runs-dir", str(stack.root / "runs"),
                        "--port", "0", "--model", str(stack.model_dir))  # fmt: skip
    url = _address(process, 60)
    runs = _get(url + "api/runs")
    assert isinstance(runs, dict)
    (run,) = [row for row in runs["runs"] if row["run_id"] == stack.run.run_id]
    assert run["steps"] == 5
    call = _get(f"{url}api/sessions/{stack.run.chained_session}/calls/0")
    assert isinstance(call, dict)
    assert "".join(token["text"] for token in call["sampled"]) == "I will read calc.py first."
    assert _stop(process, 15) == 0


@pytest.mark.slow
def test_dashboard_refuses_every_interface_without_a_token() -> None:
    process = _lodestar("dashboard", "--host", "0.0.0.0", "--rollout", "127.0.0.1:1", "--port", "0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "without a token" in output


@pytest.mark.slow
def test_up_serves_the_dashboard(tmp_path: Path) -> None:
    process = _lodestar("up", "--data-dir", str(tmp_path / "up"), "--dashboard")
    try:
        url = _address(process, 240)
        assert _get(url + "api/runs") == {"runs": []}
        assert _get(url + "healthz") == {"ok": True}
    finally:
        assert _stop(process, 60) == 0
