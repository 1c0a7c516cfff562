"""`lodestar up` runs sessions: the shipped example run (examples/runs/command-agent.yaml: the example agent,
exact_match; here with groupSize 1 to keep the test short) created with `lodestar run create` against the
local stack is pulled by its gateway node, run and scored (scripted inference backend: its default reply is
no task's answer, so every reward is 0, but no session fails)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.up_support import ADDRESS, read_until, up_process

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "runs" / "command-agent.yaml"


def _lodestar(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_run_created_against_lodestar_up_completes(tmp_path: Path):
    process = up_process(tmp_path, "--backend", "scripted", "--slots", "2")
    try:
        output = read_until(process, "Ctrl-C stops everything", timeout=240)
        rollout = f"127.0.0.1:{dict(ADDRESS.findall(output))['rollout']}"
        spec = yaml.safe_load(EXAMPLE.read_text())
        spec["groupSize"] = 1
        (tmp_path / "example.yaml").write_text(yaml.safe_dump(spec))
        shutil.copy(EXAMPLE.with_name(spec["tasks"]), tmp_path / spec["tasks"])
        run_id = _lodestar("run", "create", str(tmp_path / "example.yaml"), "--rollout", rollout).strip()
        deadline = time.monotonic() + 90
        status = {}
        while time.monotonic() < deadline:
            status = json.loads(_lodestar("run", "status", run_id, "--json", "--rollout", rollout))
            if status["state"] != "RUN_STATE_RUNNING":
                break
            time.sleep(0.5)
        assert status["state"] == "RUN_STATE_COMPLETED", status
        assert status["groupsComplete"] == 3
        assert status["sessionsSucceeded"] == 3
        assert status.get("infraFailures", 0) == 0, status
        assert status.get("rewardMean", 0.0) == 0.0
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
