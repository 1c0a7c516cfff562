"""Sessions on the `docker` runtime through a real node (scripted inference, the real gateway, a rollout
stand-in): the example agent edits the workspace inside its container, the verifier scores it there,
prompts of a group are identical, and nothing is left; a fork bomb and a disk filler hit their limits
(scored or infrastructure failure as `options.on_limit` says) while the node stays healthy; SIGTERM of a
node process kills, reports and removes its containers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2

from lodestar.v1 import gateway_pb2, rollout_pb2
from tests.docker_support import SESSION_IMAGE, containers, remove, skip_reason
from tests.gateway.conftest import StackFactory
from tests.gateway.node.conftest import AGENT, HANG_AGENT, NodeFactory, read_pids, sessions_dir
from tests.gateway.node.standin import RolloutStandIn, assignment

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SCORED = rollout_pb2.SESSION_OUTCOME_SCORED
TESTS = Path(__file__).resolve().parents[1]
"""Mounted read-only into the containers (options.mounts) for the hanging test harness."""
CHECK_FILE = {"kind": "command", "config": {"command": 'test "$(cat out.txt)" = hi', "timeout_s": 30}}


@pytest.fixture(autouse=True)
def _docker() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


def _tool(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}


def _on_docker(message: rollout_pb2.SessionAssignment, **fields: Any) -> rollout_pb2.SessionAssignment:
    options = fields.pop("options", None)
    message.runtime.CopyFrom(rollout_pb2.RuntimeSpec(kind="docker", image=SESSION_IMAGE, **fields))
    if options:
        message.runtime.options.CopyFrom(struct_pb2.Struct())
        message.runtime.options.update(options)
    return message


def test_docker_sessions_score_inside_their_containers_and_leave_nothing(
    node_factory: NodeFactory, standin: RolloutStandIn
):
    script = {"replies": [_tool("echo hi > out.txt; hostname; echo $HOME"), {"text": "done"}]}
    stack = node_factory(script)
    ids = ["d0", "d1"]
    standin.offer(*(_on_docker(assignment(sid, command=AGENT, verifier=CHECK_FILE), cpus=1) for sid in ids))

    results = standin.wait_results(2, timeout=120)

    for result in results:
        assert result.outcome == SCORED, standin.describe(result)
        assert result.reward == 1.0
        runtime = result.verifier_details["runtime"]
        assert runtime["kind"] == "docker"
        assert runtime["image"] == SESSION_IMAGE
        assert runtime["network_isolated"] is True
        assert runtime["limits_hit"] == []
        assert len(result.calls) == 2
        tool_output = result.calls[1].original_request_json
        assert "lodestar-session\\n/tmp/lodestar-session/home" in tool_output, "the tool ran in the container"
    first = [list(result.calls[0].prompt_token_ids) for result in results]
    assert first[0] == first[1], "identical paths: the two sessions of one task got identical prompts"
    assert containers(f"lodestar.sessions-dir={sessions_dir(stack).resolve()}") == []
    assert list(sessions_dir(stack).iterdir()) == []


def test_fork_bomb_and_disk_filler_hit_their_limits_and_the_node_stays_healthy(
    node_factory: NodeFactory, standin: RolloutStandIn
):
    bomb = "b() { b | b & }; b; sleep 30"
    filler = "echo hi > out.txt; dd if=/dev/zero of=big bs=1M count=64"
    stack = node_factory({"replies": [_tool(bomb), {"text": "done"}]}, slots=1, ready_buffer=0)
    limits = {"pids_limit": 64, "memory_bytes": 512 << 20, "cpus": 1}
    standin.offer(
        _on_docker(assignment("bomb", command=AGENT, agent_timeout_s=15), **limits, options={"on_limit": "infra"})
    )
    bombed = standin.wait_results(1, timeout=120)[0]
    stack.set_script({"replies": [_tool(filler), {"text": "done"}]})
    standin.offer(_on_docker(assignment("fill", command=AGENT, verifier=CHECK_FILE), **limits, disk_bytes=16 << 20))
    filled = standin.wait_results(2, timeout=120)[1]

    assert bombed.outcome == rollout_pb2.SESSION_OUTCOME_INFRA_FAILED, standin.describe(bombed)
    assert "pids" in bombed.error
    assert filled.outcome == SCORED, standin.describe(filled)
    assert filled.reward == 1.0, "the agent went on after ENOSPC, the verifier scored what it left"
    assert "disk" in filled.verifier_details["runtime"]["limits_hit"]
    status = stack.stub().GetNodeStatus(gateway_pb2.GetNodeStatusRequest(), timeout=5)
    assert status.capacity == 1
    assert containers(f"lodestar.sessions-dir={sessions_dir(stack).resolve()}") == []


def test_sigterm_of_a_node_hands_back_kills_and_removes_its_containers(
    gateway_stack_factory: StackFactory, standin: RolloutStandIn, etcd_endpoint: str, etcd_prefix: str, tmp_path: Path
):
    inference = gateway_stack_factory({"replies": [{"text": "first"}]}).inference_address
    data_dir = tmp_path / "node"
    argv = [
        sys.executable, "-m", "lodestar_app.cli.main", "gateway", "serve", "--port", "0", "--http-port", "0",
        "--inference", inference, "--rollout", standin.address, "--etcd", etcd_endpoint,
        "--etcd-prefix", etcd_prefix, "--data-dir", str(data_dir), "--poll-interval-s", "0.2", "--log-json",
        "--docker-mounts-allowed", str(TESTS),  # the hanging harness is mounted from here (options.mounts)
    ]  # fmt: skip
    pids = "/tmp/lodestar-session/tmp/pids"  # inside the container; the node sees it in the private root
    log = (tmp_path / "node.log").open("wb")
    node = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={**os.environ})
    owner = f"lodestar.sessions-dir={(data_dir / 'sessions').resolve()}"
    try:
        hang = [
            _on_docker(assignment(f"h{i}", command=HANG_AGENT, env={"PIDFILE": pids}), options={"mounts": [str(TESTS)]})
            for i in range(2)
        ]
        standin.offer(*hang)
        standin.wait_for(
            lambda: all(read_pids(data_dir / "sessions" / f"h{i}-a1" / "tmp" / "pids") for i in range(2)),
            90, "both harnesses to hang in their containers",
        )  # fmt: skip
        assert len(containers(owner)) == 2
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0
        results = standin.wait_results(2, timeout=5)
        for result in results:
            assert result.outcome == rollout_pb2.SESSION_OUTCOME_CANCELLED, standin.describe(result)
            assert result.error == "node draining: not finished within the drain grace (0 s)"
            assert len(result.calls) == 1
        assert containers(owner) == [], "every container is removed"
        assert list((data_dir / "sessions").iterdir()) == [], "every workspace is removed"
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        remove(containers(owner))
        log.close()
