"""A gateway node SIGKILLed mid-session leaves no process of the session behind (issue 44, docs/chaos.md).

A real node-like Python process runs one host session through the real launcher (`host_sandbox` bwrap: the
real sandbox; namespaces: unshare and netns_child.py) whose harness starts a background process and one that
leaves its process group (setsid), then sleeps. The test records every process below the node, SIGKILLs the
node and expects each recorded process to be gone within a few seconds. Before the fix, the bwrap sandbox
of a root node outlived it (its parent-death signal was not allowed to reach the session uid) and, with
namespaces, the harness's children did (no parent-death signal is inherited)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

NODE = r"""
import asyncio, sys
from pathlib import Path
from lodestar_gateway.node.harnesses import Invocation, Launcher
from lodestar_gateway.node.harnesses.base import clean_env
from lodestar_gateway.node.harnesses.sandbox import Sandbox
from lodestar_gateway.node.runtimes import HostBackend

HARNESS = "sleep 300 & setsid sleep 300 & echo ready > ready; wait"

async def main(sandbox: str, sessions: Path) -> None:
    launcher = Launcher(sandbox=Sandbox() if sandbox == "bwrap" else None)
    runtime = await HostBackend(sessions, launcher).create("s-a1", {})
    print(runtime.real.workdir, flush=True)
    invocation = Invocation("sleeper", ["sh", "-c", HARNESS], clean_env(runtime.visible), runtime.visible.workdir)
    result = await runtime.run_harness(runtime.translate(invocation), None, 300)
    print(result.stderr, file=sys.stderr)

asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
"""


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _below(root: int) -> dict[int, str]:
    """Every process below `root`: pid -> start time (to tell a reused pid apart)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: dict[int, str] = {}
    queue = list(children.get(root, []))
    while queue:
        pid = queue.pop()
        if (fields := _stat(pid)) is not None:
            found[pid] = fields[19]
        queue += children.get(pid, [])
    return found


def _alive(recorded: dict[int, str]) -> dict[int, str]:
    """The recorded processes still running (not gone, not a zombie, not a new process on a reused pid)."""
    alive = {}
    for pid, started in recorded.items():
        fields = _stat(pid)
        if fields is not None and fields[0] != "Z" and fields[19] == started:
            with contextlib.suppress(OSError):
                alive[pid] = " ".join(Path(f"/proc/{pid}/cmdline").read_text().split("\0")).strip()[:120]
    return alive


@pytest.fixture
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[int, str]]]:
    """The node-like process running one session of `request.param` (its host_sandbox), and every process
    below it once the harness runs (`_below`); on teardown what is left of those is SIGKILLed (only processes
    this test started)."""
    if request.param == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    sessions = tmp_path / "sessions"
    argv = [sys.executable, "-c", NODE, request.param, str(sessions)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    recorded: dict[int, str] = {}
    try:
        assert proc.stdout is not None
        workdir = Path(proc.stdout.readline().strip())
        deadline = time.monotonic() + 60
        while not (workdir / "ready").exists():
            assert proc.poll() is None, f"the node exited: {proc.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, "the harness did not start"
            time.sleep(0.05)
        time.sleep(0.2)  # both sleeps started before `ready` was written; let them exec
        recorded = _below(proc.pid)
        yield proc, recorded
    finally:
        if proc.poll() is None:
            recorded |= _below(proc.pid)
            proc.kill()
        proc.communicate()
        for pid in _alive(recorded):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("node", ["bwrap", "namespaces"], indirect=True)
def test_no_process_of_a_session_outlives_its_sigkilled_node(
    node: tuple[subprocess.Popen[str], dict[int, str]],
) -> None:
    proc, recorded = node
    commands = _alive(recorded)
    assert list(commands.values()).count("sleep 300") == 2, commands
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 3
    while _alive(recorded) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(recorded), f"left behind by the SIGKILLed node: {_alive(recorded)}"
