"""A replica's death costs no training step: `lodestar train` on the quickstart with `inference_replicas = 2`
(two `lodestar inference serve` processes registered in the stack's etcd, the tiny model, the transformers
engine), and once the first step is done the test SIGKILLs the second replica. The run still does every
step; the trainer kept pushing (the survivor published every version and served versions published after the
kill); no session was scored with a call the kill cut short (a scored quickstart session has both its calls:
the agent's non-streaming calls that the kill caught before their answer moved to the survivor, and a session
whose call failed anyway would be an infrastructure failure, retried, never a reward); a session whose
replica lived kept it."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow]
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
STEPS = 4
TIMEOUT_S = 600
VICTIM = "inference-2"


def _config(tmp_path: Path) -> Path:
    text = (QUICKSTART / "quickstart.toml").read_text()
    text = text.replace('spec = "run.yaml"', f'spec = "{QUICKSTART / "run.yaml"}"')
    text = re.sub(r"(?m)^steps = \d+", f'steps = {STEPS}\ninference_replicas = 2\nattach = "never"', text)
    text = re.sub(r"(?m)^timeout_s = \d+", f"timeout_s = {TIMEOUT_S}", text)
    text = re.sub(r"(?m)^groups_per_step = \d+", "groups_per_step = 2", text)
    text = re.sub(r'(?m)^run_dir = "[^"]*"', f'run_dir = "{tmp_path / "runs"}"', text)
    text = re.sub(r'(?m)^data_dir = "[^"]*"', f'data_dir = "{tmp_path / "stack"}"', text)
    config = tmp_path / "failover.toml"
    config.write_text(text)
    return config


def _steps_done(runs: Path) -> int:
    return sum(len(path.read_text().splitlines()) for path in runs.glob("*/metrics.jsonl"))


def _replica_pid(tmp_path: Path, replica_id: str) -> int | None:
    """The pid of this test's `inference serve --replica-id <replica_id>` process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = str(tmp_path).encode() in b" ".join(argv)
        if ours and {b"inference", b"serve", b"--replica-id", replica_id.encode()} <= set(argv):
            return int(entry.name)
    return None


def _kill_stack(tmp_path: Path) -> None:
    """SIGKILL every process whose command line names this test's directory (the services of the stack)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(tmp_path).encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue


@pytest.mark.timeout(TIMEOUT_S + 300)
def test_a_run_goes_on_when_a_replica_is_killed(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "lodestar_app.cli.main", "train", str(_config(tmp_path))], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        wait_until(lambda: _steps_done(tmp_path / "runs") >= 1 or process.poll() is not None, TIMEOUT_S,
                   interval_s=0.5, what="the first training step")  # fmt: skip
        assert process.poll() is None, "lodestar train ended before the kill"
        victim = _replica_pid(tmp_path, VICTIM)
        assert victim is not None, f"no {VICTIM} process"
        killed_after = _steps_done(tmp_path / "runs")
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        output, _ = process.communicate(timeout=TIMEOUT_S + 120)
    finally:
        if process.poll() is None:  # the run hung: stop it and what it started (their own process groups)
            process.send_signal(signal.SIGTERM)
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                _kill_stack(tmp_path)
                process.kill()
                process.communicate()
    assert process.returncode == 0, output[-6000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert _steps_done(tmp_path / "runs") == STEPS, "every step was done"

    scored, infra, first_replica, replicas_of = 0, 0, {}, {}
    survivor_versions: set[int] = set()
    with sqlite3.connect(tmp_path / "stack" / "rollout.sqlite") as db:
        rows = db.execute("SELECT session_id, result FROM results WHERE session_id LIKE ?", (f"{run_dir.name}-%",))
        for session_id, blob in rows:
            result = rollout_pb2.SessionResult.FromString(blob)
            if result.outcome == rollout_pb2.SESSION_OUTCOME_INFRA_FAILED:
                infra += 1
                continue
            if result.outcome != rollout_pb2.SESSION_OUTCOME_SCORED:
                continue
            scored += 1
            assert len(result.calls) == 2, f"{session_id} scored with {len(result.calls)} calls: {result.error}"
            assert all(call.completion_token_ids for call in result.calls)
            names = [call.inference_replica for call in result.calls]
            first_replica[session_id], replicas_of[session_id] = names[0], set(names)
            survivor_versions |= {c.policy_version for c in result.calls if c.inference_replica == "inference"}
    assert scored >= 16
    assert VICTIM in first_replica.values(), "the killed replica had served sessions"
    for session_id, first in first_replica.items():
        if first == "inference":
            assert replicas_of[session_id] == {"inference"}, f"{session_id} left a replica that lived"
    assert max(survivor_versions) > killed_after, (
        f"the survivor served no version published after the kill (step {killed_after}): {sorted(survivor_versions)}"
    )
    published = {
        int(record["policy_version"])
        for line in (tmp_path / "stack" / "logs" / "inference.log").read_text().splitlines()
        if line.startswith("{") and (record := json.loads(line)).get("event") == "policy version published"
    }
    assert published == set(range(1, STEPS + 1)), f"every push reached the survivor: {sorted(published)}"
    log = (tmp_path / "stack" / "logs" / "gateway.log").read_text()
    assert "inference replica removed" in log, "the gateway saw the replica leave etcd"
    moved = log.count("inference replica failed a call before its first token")
    print(f"killed {VICTIM} after step {killed_after} ({time.time() - killed_at:.0f} s before the end); "
          f"{scored} scored results, {infra} infrastructure failures, {moved} calls moved")  # fmt: skip
