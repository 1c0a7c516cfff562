"""`lodestar train CONFIG` as the e2e tests run it: a subprocess with a deadline that never outlives the test."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2


def call_versions(store: Path, run_id: str) -> set[int]:
    """The policy versions reported by the calls of the run's results in the rollout store (SQLite)."""
    found: set[int] = set()
    with sqlite3.connect(store) as db:
        for (blob,) in db.execute("SELECT result FROM results WHERE session_id LIKE ?", (f"{run_id}-%",)):
            found |= {call.policy_version for call in rollout_pb2.SessionResult.FromString(blob).calls}
    return found


def call_starts(store: Path, run_id: str) -> list[tuple[float, int]]:
    """(start time in seconds since the epoch, policy version) of every call of the run's results."""
    found: list[tuple[float, int]] = []
    with sqlite3.connect(store) as db:
        for (blob,) in db.execute("SELECT result FROM results WHERE session_id LIKE ?", (f"{run_id}-%",)):
            calls = rollout_pb2.SessionResult.FromString(blob).calls
            found += [(call.started_at.ToNanoseconds() / 1e9, call.policy_version) for call in calls]
    return found


def run_train(config: Path, cwd: Path, timeout_s: float) -> tuple[int, str]:
    """Run `lodestar train CONFIG` in `cwd` (stdout and stderr together, a terminal 200 columns wide) and
    return (exit code, output). At the deadline, or when the test is interrupted, SIGTERM it (it stops the
    services it started), then kill it after 60 s; a run past the deadline fails the test with its output."""
    process = subprocess.Popen(
        [sys.executable, "-m", "lodestar_app.cli.main", "train", str(config)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=cwd, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    output = ""
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                output += process.communicate(timeout=60)[0]
            except subprocess.TimeoutExpired:
                process.kill()
                output += process.communicate()[0]
            pytest.fail(f"lodestar train still running after {timeout_s:.0f} s:\n{output[-4000:]}", pytrace=False)
    return process.returncode, output
