"""Runs on the `docker` runtime on the real stack (processes: scripted inference, rollout on SQLite, two
gateway nodes, etcd), marker `docker`: the rollout e2e shape (3 tasks x 2) with the example agent editing
its container's workspace and the verifier scoring it there; SIGKILL of a node during RUN (its containers
are removed at once by its reaper, its sessions requeued and finished by the other node; a node that
starts removes containers an earlier process left). One stack for the module (~10 s).
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from tests.docker_support import SESSION_IMAGE, containers, remove, skip_reason
from tests.e2e.node_stack import AGENT, NodeStack

pytestmark = [pytest.mark.docker, pytest.mark.slow]
WRITE = {"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi > out.txt"}}]}
SLOW = {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 6; echo hi > out.txt"}}]}
CHECK = {"kind": "command", "config": {"command": 'test "$(cat out.txt)" = hi', "timeout_s": 30}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[NodeStack]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("docker-e2e")
    prefix = f"/e2e-docker/{uuid.uuid4().hex}/"
    with NodeStack.start(root, etcd_endpoint, prefix, script={"replies": [WRITE, {"text": "done"}]}) as started:
        yield started
    for index in range(2):
        remove(containers(_owner(started, index)))


def _owner(stack: NodeStack, index: int) -> str:
    return f"lodestar.sessions-dir={(stack.root / f'node-{index}' / 'sessions').resolve()}"


def _spec(name: str, tasks: int, group_size: int, **runtime: Any) -> dict[str, Any]:
    return {
        "name": name,
        "tasks": [{"taskId": f"{name}-{i}", "prompt": "Write hi into out.txt, then say done."} for i in range(tasks)],
        "groupSize": group_size,
        "harness": {"kind": "command", "command": AGENT, "model": "lodestar-tiny"},
        "verifier": CHECK,
        "maxAttempts": 3,
        "sessionTimeout": "120s",
        "agentTimeout": "60s",
        "runtime": {"kind": "docker", "image": SESSION_IMAGE, "cpus": 1, "memoryBytes": 1 << 30, **runtime},
    }


def test_docker_run_three_tasks_by_two_scores_in_containers(stack: NodeStack):
    stack.set_script({"replies": [WRITE, {"text": "done"}]})
    run_id = stack.create_run(_spec("dock", 3, 2, pidsLimit=256))

    run = stack.wait_run(run_id, timeout=180)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_total, run.sessions_succeeded, run.sessions_failed) == (6, 6, 0)
    assert run.reward_mean == pytest.approx(1.0)
    groups = stack.groups(run_id)
    assert len(groups) == 3
    for group in groups:
        assert len({tuple(session.calls[0].prompt_token_ids) for session in group.sessions}) == 1
        for session in group.sessions:
            assert session.verifier_details["runtime"]["kind"] == "docker"
            assert session.verifier_details["runtime"]["limits"]["pids_limit"] == 256
    for index in range(2):
        assert containers(_owner(stack, index)) == []
        assert list((stack.root / f"node-{index}" / "sessions").iterdir()) == []


def test_sigkill_of_a_docker_node_removes_its_containers_and_requeues_its_sessions(stack: NodeStack):
    stack.set_script({"replies": [SLOW, {"text": "done"}]})
    run_id = stack.create_run(_spec("dockkill", 2, 2), name="dockkill.yaml")
    victim = stack.nodes[0]
    deadline = time.monotonic() + 60
    while stack.node_status(victim).stage_counts["RUN"] < 1:
        assert time.monotonic() < deadline, "node-0 never ran a session"
        time.sleep(0.1)
    assert containers(_owner(stack, 0)), "node-0's session runs in a container"

    victim.stop(signal.SIGKILL)
    killed = time.monotonic()
    while containers(_owner(stack, 0)) and time.monotonic() - killed < 20:
        time.sleep(0.2)
    removed_after = time.monotonic() - killed
    assert containers(_owner(stack, 0)) == [], "the dead node's reaper removed its containers"
    # A container an earlier process left behind (e.g. its reaper was killed too) goes when the node starts.
    leftover = subprocess.run(
        ["docker", "run", "-d", "--label", _owner(stack, 0), "--entrypoint", "sleep", SESSION_IMAGE, "600"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    stack.nodes[0] = stack.restart_node(0)
    deadline = time.monotonic() + 20
    while leftover in containers(_owner(stack, 0)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftover not in containers(_owner(stack, 0)), "the restarted node removed the leftover"

    run = stack.wait_run(run_id, timeout=180)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_succeeded, run.sessions_total) == (4, 4)
    retried = stack.store_rows("SELECT COUNT(*) FROM sessions WHERE run_id = ? AND attempt > 1", run_id)
    assert retried[0][0] >= 1, "the killed node's sessions ran again as new attempts"
    assert removed_after < 10, f"containers removed {removed_after:.1f} s after the kill"
    for index in range(2):
        assert containers(_owner(stack, index)) == []
