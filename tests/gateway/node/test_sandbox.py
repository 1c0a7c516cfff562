"""The host runtime's sandbox against an evil agent: a script run as the harness of a real session (a real
host runtime, bubblewrap, a real HTTP "gateway" it may reach and a second port it must not), next to a second
session and a node data directory with a secret. Every attempt of the agent is checked twice: it succeeds
without the sandbox (the control: the attack is real) and fails inside it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from lodestar_gateway.node.harnesses import Invocation, Launcher
from lodestar_gateway.node.harnesses.base import clean_env
from lodestar_gateway.node.harnesses.sandbox import Sandbox
from lodestar_gateway.node.runtimes import HostBackend
from tests.gateway.node.evil_agent import ESCAPES, EVIL, gateway_port, other_port

__all__ = ["gateway_port", "other_port"]  # fixtures

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


async def _attack(tmp_path: Path, launcher: Launcher, gateway_port: int, other_port: int) -> dict[str, Any]:
    data_dir = tmp_path / "node-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "capture.sqlite").write_text("session keys")
    sessions = tmp_path / "sessions"
    backend = HostBackend(sessions, launcher)
    other = await backend.create("other-a1", {"secret.txt": "the other session's work"})
    mine = await backend.create("mine-a1", {})
    host_file = Path.cwd() / f".sandbox-probe-{os.getpid()}"
    targets = {
        "other_session_file": str(other.real.workdir / "secret.txt"),
        "node_secret": str(data_dir / "capture.sqlite"),
        "host_file": str(host_file),
        "node_pid": os.getpid(),
        "other_port": other_port,
        "gateway_port": gateway_port,
        "node_install": sys.prefix,
    }
    invocation = Invocation(
        "evil", [sys.executable, "-c", EVIL, json.dumps(targets)], clean_env(mine.visible), mine.visible.workdir
    )
    try:
        result = await mine.run_harness(mine.translate(invocation), f"http://127.0.0.1:{gateway_port}", 60)
    finally:
        wrote_host = host_file.exists()
        host_file.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(sys.prefix, "owned.txt"))  # the control's write into the node install
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    found["host_file_exists"] = wrote_host
    found["own_file_on_node"] = (mine.real.workdir / "own.txt").exists()
    found["sandboxed"] = result.sandboxed
    return found


async def test_the_evil_agent_is_contained(tmp_path: Path, gateway_port: int, other_port: int) -> None:
    data_dir = tmp_path / "node-data"
    sandbox = Sandbox(hidden=[data_dir, tmp_path / "sessions", Path.cwd() / ".lodestar"])
    inside = await _attack(tmp_path, Launcher(sandbox=sandbox), gateway_port, other_port)
    outside = await _attack(tmp_path / "control", Launcher(isolate_network=False), gateway_port, other_port)

    for attack in ESCAPES:
        if attack not in ("uid_0", "capabilities", "write_node_install") or os.getuid() == 0:
            assert outside[attack], f"control: {attack} works unsandboxed"
        assert not inside[attack], f"{attack} succeeded inside the sandbox: {inside}"
    assert inside["sandboxed"]
    assert not inside["host_file_exists"]
    assert inside["reach_gateway"], "the gateway stays reachable"
    assert inside["write_own_workspace"], "the session's own files are writable"
    assert inside["own_file_on_node"]
    assert inside["processes_visible"] <= 4, inside  # bwrap's init, the helper-turned-harness, maybe its child
    assert outside["processes_visible"] > inside["processes_visible"]


async def test_a_sandbox_that_cannot_run_refuses_the_session(tmp_path: Path, gateway_port: int) -> None:
    from lodestar.errors import FailedPreconditionError

    launcher = Launcher(sandbox=Sandbox(binary="no-such-bwrap"))
    runtime = await HostBackend(tmp_path / "sessions", launcher).create("s-a1", {})
    invocation = Invocation("h", ["true"], clean_env(runtime.visible), runtime.visible.workdir)
    with pytest.raises(FailedPreconditionError, match="sandbox cannot run here: no-such-bwrap is not installed"):
        await runtime.run_harness(runtime.translate(invocation), f"http://127.0.0.1:{gateway_port}", 10)


DAEMON = r"""
import os, subprocess
from pathlib import Path
subprocess.Popen(["setsid", "sleep", "300"], start_new_session=True)  # leaves the process group
Path("pidns").write_text(os.readlink("/proc/self/ns/pid"))
"""


def _in_namespace(namespace: str) -> list[int]:
    """Live (not zombie) processes in PID namespace `namespace`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (
                    os.readlink(entry / "ns" / "pid") == namespace
                    and "\nState:\tZ" not in (entry / "status").read_text()
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_a_daemon_that_left_the_process_group_ends_with_the_sandbox(tmp_path: Path, gateway_port: int) -> None:
    runtime = await HostBackend(tmp_path / "sessions", Launcher(sandbox=Sandbox())).create("s-a1", {})
    invocation = Invocation(
        "daemon", [sys.executable, "-c", DAEMON], clean_env(runtime.visible), runtime.visible.workdir
    )
    result = await runtime.run_harness(runtime.translate(invocation), f"http://127.0.0.1:{gateway_port}", 30)
    assert result.returncode == 0, result.stderr
    namespace = (runtime.real.workdir / "pidns").read_text()
    assert namespace != os.readlink("/proc/self/ns/pid"), "the session had a PID namespace of its own"
    assert _in_namespace(namespace) == [], "no process of the session outlives its run (zombies aside)"
