"""A verifier runs the agent's code (its tests, its scripts), so on the host runtime it gets what the harness
gets: a loopback-only network namespace of its own, with nothing relayed into it (a verifier needs no
gateway). A real `command` verifier on a real host runtime runs a script the agent left in its workspace
that tries to reach a local port of the node's host (another service: rollout, etcd, inference...) and the
gateway's port. Inside the bubblewrap sandbox (the default) and with `host_sandbox = "namespaces"` (unshare)
it reaches neither, while its own loopback works; the control, a launcher without isolation, reaches both:
the attack is real."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Launcher
from lodestar_gateway.node.harnesses.sandbox import Sandbox
from lodestar_gateway.node.runtimes import HostBackend
from lodestar_gateway.node.verifiers import VerifierInput, make_verifier
from tests.gateway.node.evil_agent import gateway_port, other_port

__all__ = ["gateway_port", "other_port"]  # fixtures

PROBE = r"""
import json, os, socket, sys

def reaches(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False

def own_loopback():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        socket.create_connection(server.getsockname(), timeout=2).close()
    return True

found = {"other": reaches(int(sys.argv[1])), "gateway": reaches(int(sys.argv[2])), "own": own_loopback()}
print(json.dumps(found))
sys.exit(0 if found["other"] or found["gateway"] else 1)
"""
"""The agent's `probe.py`: the reward is 1 when it got out (what a policy under RL would learn to do)."""


async def _verify(tmp_path: Path, launcher: Launcher, gateway_port: int, other_port: int) -> tuple[float, Any]:
    runtime = await HostBackend(tmp_path / "sessions", launcher).create("s1-a1", {"probe.py": PROBE})
    given = VerifierInput(
        task=rollout_pb2.Task(task_id="t1", prompt="p"),
        final_answer="done",
        workspace=runtime.visible.workdir,
        timed_out=False,
        run=runtime.run_process,
        scratch=runtime.real.tmpdir,
        scratch_visible=runtime.visible.tmpdir,
        root=runtime.root,
        workspace_host=runtime.real.workdir,
    )
    spec = rollout_pb2.VerifierSpec(kind="command")
    spec.config.update({"command": f"{sys.executable} -I probe.py {other_port} {gateway_port}"})
    try:
        verdict = await make_verifier(spec).score(given)
    finally:
        await runtime.cleanup()
    found = json.loads(verdict.details["stdout_tail"].strip().splitlines()[-1])
    return verdict.reward, found


async def test_without_isolation_the_probe_gets_out(tmp_path: Path, gateway_port: int, other_port: int) -> None:
    """The control: the ports are there to be reached."""
    launcher = Launcher(isolate_network=False, mount_namespaces=False)
    reward, found = await _verify(tmp_path, launcher, gateway_port, other_port)
    assert (reward, found) == (1.0, {"other": True, "gateway": True, "own": True})


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
async def test_a_sandboxed_verifier_reaches_no_local_port(tmp_path: Path, gateway_port: int, other_port: int) -> None:
    launcher = Launcher(sandbox=Sandbox(hidden=[tmp_path / "sessions"]))
    reward, found = await _verify(tmp_path, launcher, gateway_port, other_port)
    assert (reward, found) == (0.0, {"other": False, "gateway": False, "own": True})


async def test_a_verifier_under_host_sandbox_namespaces_reaches_no_local_port(
    tmp_path: Path, gateway_port: int, other_port: int
) -> None:
    launcher = Launcher(isolate_network=True)
    if not await launcher.isolation.available():
        pytest.skip("unshare --net is not permitted on this machine (no network namespaces)")
    reward, found = await _verify(tmp_path, launcher, gateway_port, other_port)
    assert (reward, found) == (0.0, {"other": False, "gateway": False, "own": True})
