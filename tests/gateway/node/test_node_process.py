"""`lodestar gateway serve --rollout ...` as a real process: SIGTERM drains it. Its sessions go back to
rollout as CANCELLED ("node draining": requeued without spending an attempt), killed and cleaned up; with a
drain grace, a session that ends within it is scored."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from tests.gateway.conftest import StackFactory
from tests.gateway.node.conftest import HANG_AGENT, kill_pids, read_pids, wait_dead
from tests.gateway.node.standin import RolloutStandIn, assignment

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def _node(stack: StackFactory, standin: RolloutStandIn, etcd: tuple[str, str], tmp_path: Path,
          *flags: str) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """`lodestar gateway serve` as a process (data in tmp_path/node, log in tmp_path/node.log), killed with every
    harness process of tmp_path/pids when the block ends."""
    inference = stack({"replies": [{"text": "first"}]}).inference_address
    argv = [
        sys.executable, "-m", "lodestar_app.cli.main", "gateway", "serve", "--port", "0", "--http-port", "0",
        "--inference", inference, "--rollout", standin.address, "--etcd", etcd[0], "--etcd-prefix", etcd[1],
        "--data-dir", str(tmp_path / "node"), "--poll-interval-s", "0.2", "--log-json",
        "--host-sandbox", "namespaces",  # its harnesses write the host's PIDFILE (the sandbox would hide it)
        *flags,
    ]  # fmt: skip
    with (tmp_path / "node.log").open("wb") as log:
        node = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={**os.environ})
        try:
            yield node
        finally:
            if node.poll() is None:
                node.kill()
                node.wait()
            kill_pids(read_pids(tmp_path / "pids"))


def test_sigterm_hands_back_kills_and_cleans_up_in_flight_sessions(
    gateway_stack_factory: StackFactory, standin: RolloutStandIn, etcd_endpoint: str, etcd_prefix: str, tmp_path: Path
):
    data_dir, pidfile = tmp_path / "node", tmp_path / "pids"
    with _node(gateway_stack_factory, standin, (etcd_endpoint, etcd_prefix), tmp_path) as node:
        standin.offer(*(assignment(f"s{i}", command=HANG_AGENT, env={"PIDFILE": str(pidfile)}) for i in range(2)))
        standin.wait_for(lambda: len(read_pids(pidfile)) == 4, 60, "both harnesses to hang")
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0
        results = standin.wait_results(2, timeout=5)
        for result in results:
            assert result.outcome == rollout_pb2.SESSION_OUTCOME_CANCELLED, standin.describe(result)
            assert result.error == "node draining: not finished within the drain grace (0 s)"
            assert len(result.calls) == 1
        assert wait_dead(read_pids(pidfile)), "every harness process is gone"
        assert list((data_dir / "sessions").iterdir()) == [], "every workspace is removed"


def test_a_drain_grace_lets_running_sessions_finish_and_hands_back_the_rest(
    gateway_stack_factory: StackFactory, standin: RolloutStandIn, etcd_endpoint: str, etcd_prefix: str, tmp_path: Path
):
    """Two run slots: `done` ends within the grace (scored), `hang` does not (handed back after it), `waiting`
    never got a slot (handed back at once)."""
    data_dir, pidfile, release = tmp_path / "node", tmp_path / "pids", tmp_path / "release"
    flags = ("--slots", "2", "--drain-grace-s", "8")
    with _node(gateway_stack_factory, standin, (etcd_endpoint, etcd_prefix), tmp_path, *flags) as node:
        env = {"PIDFILE": str(pidfile)}
        standin.offer(assignment("done", command=HANG_AGENT, env={**env, "RELEASE": str(release)}),
                      assignment("hang", command=HANG_AGENT, env=env))  # fmt: skip
        # Each hanging harness writes two pids (its own, its sleep's): 4 once both hang (== 2 raced them).
        standin.wait_for(lambda: len(read_pids(pidfile)) == 4, 60, "both harnesses to hang")
        standin.offer(assignment("waiting", command=HANG_AGENT, env=env))
        ready = rollout_pb2.SESSION_STAGE_READY
        standin.wait_for(lambda: ready in standin.stages_seen("waiting"), 30, "the third session to wait for a slot")
        node.send_signal(signal.SIGTERM)
        first = standin.wait_results(1, timeout=10)
        assert [(r.session_id, r.outcome, r.error) for r in first] == [
            ("waiting", rollout_pb2.SESSION_OUTCOME_CANCELLED, "node draining")
        ], "a session whose harness had not started goes back at once"
        release.touch()
        assert node.wait(timeout=40) == 0
        results = {result.session_id: result for result in standin.wait_results(3, timeout=5)}
        assert results["done"].outcome == rollout_pb2.SESSION_OUTCOME_SCORED, standin.describe(results["done"])
        assert results["hang"].outcome == rollout_pb2.SESSION_OUTCOME_CANCELLED
        assert results["hang"].error == "node draining: not finished within the drain grace (8 s)"
        assert list((data_dir / "sessions").iterdir()) == []
