"""What a node SIGKILLed mid-run leaves running, and the next node process ending it (run_groups.py).

The chaos hour left a verifier sandbox's first process behind (bubblewrap's clone child, blocked in its set-up,
its session leader gone, no parent-death signal yet) when its node was killed. Here a real "node" process runs a
real harness through the launcher, is SIGKILLed, and the run's session leader is killed too: its other process
lives on in the group. A node that starts (HostBackend.remove_leftovers, as GatewayNode.start calls it) kills it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lodestar_gateway.node.harnesses import Command, GatewayEndpoint, Launcher
from lodestar_gateway.node.harnesses.run_groups import RunGroups
from lodestar_gateway.node.runtimes import HostBackend
from tests.waiting import eventually

pytestmark = pytest.mark.slow

NODE = """
import asyncio, sys
from pathlib import Path
from lodestar_gateway.node.harnesses import Command, GatewayEndpoint, Launcher
from lodestar_gateway.node.harnesses.run_groups import RunGroups
from lodestar_gateway.node.runtimes import HostBackend

async def main(data: Path) -> None:
    launcher = Launcher(isolate_network=False, mount_namespaces=False, groups=RunGroups(data / "run-groups"))
    runtime = await HostBackend(data / "sessions", launcher).create("s", {})
    script = "sleep 300 & echo $$ $! > $HOME/pids; exec sleep 300"  # the leader, and a member of its group
    endpoint = GatewayEndpoint("http://127.0.0.1:9", "k", "m")
    prepared = Command(["bash", "-c", script]).prepare(runtime.real, endpoint, "p")
    await launcher.run(runtime.translate(prepared), None, 600)

asyncio.run(main(Path(sys.argv[1])))
"""


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


async def test_a_node_that_starts_kills_what_a_killed_node_left_in_its_runs_groups(tmp_path: Path) -> None:
    node = await asyncio.to_thread(subprocess.Popen, [sys.executable, "-c", NODE, str(tmp_path)])
    pids = tmp_path / "sessions" / "s" / "home" / "pids"
    leader = member = 0
    try:
        await eventually(lambda: pids.is_file() and len(pids.read_text().split()) == 2, 30, what="the run started")
        leader, member = map(int, pids.read_text().split())
        assert os.getpgid(member) == leader, "the run is a process group of its own"
        assert (tmp_path / "run-groups" / str(leader)).is_file(), "recorded while it runs"
        node.kill()
        node.wait()
        os.kill(leader, signal.SIGKILL)  # the session leader gone, as in the hour; its group lives on
        await eventually(lambda: not _alive(leader), 5, what="the leader gone")
        await asyncio.sleep(0.5)
        assert _alive(member), "left behind: nothing ended the run"

        launcher = Launcher(isolate_network=False, mount_namespaces=False, groups=RunGroups(tmp_path / "run-groups"))
        assert await HostBackend(tmp_path / "sessions", launcher).remove_leftovers() == 1  # the session directory
        await eventually(lambda: not _alive(member), 5, what="the leftover killed")
        assert list((tmp_path / "run-groups").iterdir()) == [], "the records are forgotten"
    finally:
        node.kill()
        for pid in (leader, member):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)


async def test_a_run_that_ends_leaves_no_record(tmp_path: Path) -> None:
    launcher = Launcher(isolate_network=False, mount_namespaces=False, groups=RunGroups(tmp_path / "run-groups"))
    runtime = await HostBackend(tmp_path / "sessions", launcher).create("s", {})
    endpoint = GatewayEndpoint("http://127.0.0.1:9", "k", "m")
    prepared = Command(["bash", "-c", "echo done"]).prepare(runtime.real, endpoint, "p")
    result = await launcher.run(runtime.translate(prepared), None, 30)
    assert result.returncode == 0
    assert list((tmp_path / "run-groups").iterdir()) == []


def test_a_group_recorded_before_a_reboot_is_never_touched(tmp_path: Path) -> None:
    groups = RunGroups(tmp_path / "run-groups")
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # its own session and group
    try:
        groups.started(bystander.pid)
        (tmp_path / "run-groups" / str(bystander.pid)).write_text("the boot before\n")
        groups.started(2**31 - 1)  # a group whose members are all gone
        assert groups.kill_leftovers() == 0
        assert bystander.poll() is None
        assert list((tmp_path / "run-groups").iterdir()) == []
    finally:
        bystander.kill()
        bystander.wait()
