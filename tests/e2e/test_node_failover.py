"""End to end, infrastructure faults under a running run: the rollout leader is SIGKILLed (its standby on
the same store takes over, nodes follow it), and etcd is stopped and restarted (services reconnect). In
both the run completes and every session is counted exactly once (read from the rollout store).

The stack has its own etcd (this module stops it) and a standby rollout instance.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from tests.conftest import EtcdServer, _healthy
from tests.e2e.node_stack import AGENT, NodeStack

pytestmark = pytest.mark.slow
SLOW_SCRIPT = {
    "replies": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 2; echo hi > out.txt"}}]},
        {"text": "done"},
    ]
}


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("failover-etcd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdServer) -> Iterator[NodeStack]:
    root = tmp_path_factory.mktemp("failover-e2e")
    prefix = f"/e2e/{uuid.uuid4().hex}/"
    with NodeStack.start(root, etcd.endpoint, prefix, script=SLOW_SCRIPT, standby=True) as started:
        yield started


def _run(stack: NodeStack, name: str) -> str:
    prompt, answer = "Write hi into out.txt.", {"answer": "done"}
    tasks = [{"taskId": f"{name}{i}", "prompt": prompt, "metadata": answer} for i in (0, 1)]
    spec = {
        "name": name,
        "tasks": tasks,
        "groupSize": 4,
        "harness": {"kind": "command", "command": AGENT},
        "verifier": {"kind": "exact_match"},
        "earlyStopFraction": 1.0,
        "maxAttempts": 3,
    }
    return stack.create_run(spec, name=f"{name}.yaml")


def _wait_some_done(stack: NodeStack, run_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = stack.get_run(run_id)
        if run.sessions_succeeded >= 1 and run.sessions_running >= 1:
            return
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never had finished and running sessions at once")


def _assert_complete_and_counted_once(stack: NodeStack, run_id: str) -> None:
    run = stack.wait_run(run_id, timeout=120)
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_total, run.sessions_succeeded, run.groups_complete) == (8, 8, 2)
    counted = stack.store_rows(
        "SELECT s.session_id, COALESCE(SUM(r.counted), 0) FROM sessions s LEFT JOIN results r "
        "ON r.session_id = s.session_id WHERE s.run_id = ? GROUP BY s.session_id",
        run_id,
    )
    assert len(counted) == 8
    assert all(total == 1 for _, total in counted), counted
    groups = stack.groups(run_id)
    assert sorted(len(group.sessions) for group in groups) == [4, 4]


def test_rollout_leader_killed_standby_takes_over_and_the_run_completes(stack: NodeStack):
    run_id = _run(stack, "leader")
    _wait_some_done(stack, run_id)

    took_over_s = stack.fail_over()

    assert took_over_s < 15
    _assert_complete_and_counted_once(stack, run_id)


def test_etcd_stopped_and_restarted_the_run_completes(stack: NodeStack, etcd: EtcdServer, tmp_path: Path):
    run_id = _run(stack, "etcd")
    _wait_some_done(stack, run_id)
    argv = list(etcd.process.args)  # type: ignore[arg-type]
    etcd.stop()
    time.sleep(3)
    with (tmp_path / "etcd.log").open("ab") as log:
        etcd.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while not _healthy(etcd.endpoint):
        assert time.monotonic() < deadline, "etcd did not come back"
        time.sleep(0.1)

    _assert_complete_and_counted_once(stack, run_id)
