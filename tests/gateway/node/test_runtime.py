"""Session runtimes: private directories with the task's files, seen at the same fixed paths by every
session (bind mounts in a mount namespace of each run), translated harness invocations, clean-up."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar_gateway.node.harnesses import Command, GatewayEndpoint, Launcher, Pi
from lodestar_gateway.node.runtimes import HostBackend
from tests.waiting import eventually

PROBE = (
    "import json, os\n"
    "print(json.dumps({'cwd': os.getcwd(), 'home': os.environ['HOME'], 'tmp': os.environ['TMPDIR'],"
    " 'task': open('task.txt').read()}))\n"
    "open(os.path.join(os.environ['HOME'], 'written'), 'w').write('x')\n"
)


async def test_every_session_sees_the_same_paths_and_only_its_own_files(tmp_path: Path):
    launcher = Launcher()
    factory = HostBackend(tmp_path / "sessions", launcher)
    if not await launcher.mounts.available():
        pytest.fail("mount namespaces are expected on the test machines (root)")
    runtimes = [await factory.create(f"s{i}", {"task.txt": f"task {i}"}) for i in range(2)]
    endpoint = GatewayEndpoint("http://127.0.0.1:9", "key", "m")

    async def run(index: int) -> dict[str, str]:
        runtime = runtimes[index]
        invocation = runtime.translate(Command([sys.executable, "-c", PROBE]).prepare(runtime.real, endpoint, "p"))
        result = await launcher.run(invocation, None, 30, binds=runtime.binds)
        assert result.ok, result.stderr
        assert result.mounted
        seen: dict[str, str] = json.loads(result.stdout)
        return seen

    first, second = await asyncio.gather(run(0), run(1))
    assert first["cwd"] == second["cwd"] == "/tmp/lodestar-session/work"
    assert first["home"] == second["home"] == "/tmp/lodestar-session/home"
    assert first["tmp"] == "/tmp/lodestar-session/tmp"
    assert (first["task"], second["task"]) == ("task 0", "task 1")
    for runtime in runtimes:
        assert (runtime.real.home / "written").read_text() == "x", "writes land in the private directory"
        await runtime.cleanup()
        assert not runtime.root.exists()
    leaked = Path("/tmp/lodestar-session/home/written")
    assert not await asyncio.to_thread(leaked.exists), "nothing lands at the fixed path itself"


async def test_translate_rewrites_argv_env_and_config_files(tmp_path: Path):
    runtime = await HostBackend(tmp_path / "sessions", Launcher()).create("s", {})
    pi = Pi(bin_dir=tmp_path)
    invocation = runtime.translate(pi.prepare(runtime.real, GatewayEndpoint("http://127.0.0.1:9", "k", "m"), "p"))
    assert invocation.env["HOME"] == "/tmp/lodestar-session/home"
    assert invocation.env["PI_CODING_AGENT_DIR"] == "/tmp/lodestar-session/home/.pi/agent"
    assert invocation.cwd == Path("/tmp/lodestar-session/work")
    assert all(str(runtime.root) not in value for value in invocation.env.values())
    assert invocation.config_files[0].is_relative_to(runtime.real.home), "config files stay where they were written"


async def test_without_mount_namespaces_sessions_see_real_paths(tmp_path: Path):
    runtime = await HostBackend(tmp_path / "sessions", Launcher(mount_namespaces=False)).create("s", {"a": "b"})
    assert not runtime.fixed_paths
    assert runtime.visible == runtime.real
    assert runtime.binds == []
    assert (runtime.real.workdir / "a").read_text() == "b"


@pytest.mark.parametrize("path", ["/etc/passwd", "../escape", "a/../../b", ""])
async def test_task_files_must_stay_in_the_workspace(tmp_path: Path, path: str):
    with pytest.raises(InvalidArgumentError, match="inside the workspace"):
        await HostBackend(tmp_path / "sessions", Launcher()).create("s", {path: "x"})


async def test_leftovers_of_a_dead_node_are_removed(tmp_path: Path):
    factory = HostBackend(tmp_path / "sessions", Launcher())
    await factory.create("old-1", {"f": "x"})
    await factory.create("old-2", {})
    assert await factory.remove_leftovers() == 2
    assert list((tmp_path / "sessions").iterdir()) == []


@pytest.mark.slow
async def test_processes_that_leave_the_process_group_are_killed_with_the_run(tmp_path: Path):
    launcher = Launcher()
    runtime = await HostBackend(tmp_path / "sessions", launcher).create("s", {})
    endpoint = GatewayEndpoint("http://127.0.0.1:9", "key", "m")
    escape = "setsid sleep 300 & echo $! > $HOME/escaped.pid; sleep 300"
    invocation = runtime.translate(Command(["bash", "-c", escape]).prepare(runtime.real, endpoint, "p"))
    result = await launcher.run(invocation, None, 1.5, binds=runtime.binds)
    assert result.timed_out
    status = Path(f"/proc/{int((runtime.real.home / 'escaped.pid').read_text())}/status")

    def gone() -> bool:
        try:
            return "State:\tZ" in status.read_text()
        except FileNotFoundError:
            return True

    await eventually(lambda: asyncio.to_thread(gone), 5, what="the process that called setsid to end with the run")
