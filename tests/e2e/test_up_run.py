"""`lodestar up` runs sessions: a run created with `lodestar run create` against the local stack is pulled
by its gateway node, run with the example agent and scored (scripted inference backend)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_up import ADDRESS, _read_until, _up

pytestmark = pytest.mark.slow
ANSWER = "Hello from the scripted engine."  # the scripted engine's reply without a script


def _lodestar(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lodestar.cli.main", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_run_created_against_lodestar_up_completes(tmp_path: Path):
    process = _up(tmp_path, "--backend", "scripted", "--slots", "2")
    try:
        output = _read_until(process, "Ctrl-C stops everything", timeout=240)
        rollout = f"127.0.0.1:{dict(ADDRESS.findall(output))['rollout']}"
        spec = {
            "name": "up",
            "tasks": [{"taskId": "hello", "prompt": "Say hello.", "metadata": {"answer": ANSWER}}],
            "groupSize": 2,
            "harness": {"kind": "command", "command": ["python", "{repo}/examples/agent/agent.py", "{prompt}"]},
            "verifier": {"kind": "exact_match"},
        }
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        run_id = _lodestar("run", "create", str(tmp_path / "spec.yaml"), "--rollout", rollout).strip()
        deadline = time.monotonic() + 90
        status = {}
        while time.monotonic() < deadline:
            status = json.loads(_lodestar("run", "status", run_id, "--json", "--rollout", rollout))
            if status["state"] != "RUN_STATE_RUNNING":
                break
            time.sleep(0.5)
        assert status["state"] == "RUN_STATE_COMPLETED", status
        assert status["sessionsSucceeded"] == 2
        assert status["rewardMean"] == 1.0
        assert status["groupsComplete"] == 1
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
