"""`lodestar gateway serve --rollout ...` as a real process: SIGTERM kills and reports its sessions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from tests.gateway.conftest import StackFactory
from tests.gateway.node.conftest import HANG_AGENT, kill_pids, read_pids, wait_dead
from tests.gateway.node.standin import RolloutStandIn, assignment

pytestmark = pytest.mark.slow


def test_sigterm_kills_reports_and_cleans_up_in_flight_sessions(
    gateway_stack_factory: StackFactory, standin: RolloutStandIn, etcd_endpoint: str, etcd_prefix: str, tmp_path: Path
):
    inference = gateway_stack_factory({"replies": [{"text": "first"}]}).inference_address
    data_dir = tmp_path / "node"
    argv = [
        sys.executable, "-m", "lodestar.cli.main", "gateway", "serve", "--port", "0", "--http-port", "0",
        "--inference", inference, "--rollout", standin.address, "--etcd", etcd_endpoint,
        "--etcd-prefix", etcd_prefix, "--data-dir", str(data_dir), "--poll-interval-s", "0.2", "--log-json",
        "--host-sandbox", "namespaces",  # its harnesses write the host's PIDFILE (the sandbox would hide it)
    ]  # fmt: skip
    pidfile = tmp_path / "pids"
    log = (tmp_path / "node.log").open("wb")
    node = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={**os.environ})
    try:
        standin.offer(*(assignment(f"s{i}", command=HANG_AGENT, env={"PIDFILE": str(pidfile)}) for i in range(2)))
        standin.wait_for(lambda: len(read_pids(pidfile)) == 4, 60, "both harnesses to hang")
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0
        results = standin.wait_results(2, timeout=5)
        for result in results:
            assert result.outcome == rollout_pb2.SESSION_OUTCOME_INFRA_FAILED, standin.describe(result)
            assert result.error == "node shutting down"
            assert len(result.calls) == 1
        assert wait_dead(read_pids(pidfile)), "every harness process is gone"
        assert list((data_dir / "sessions").iterdir()) == [], "every workspace is removed"
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        kill_pids(read_pids(pidfile))
        log.close()
