"""The `docker` runtime on a real Docker daemon (marker `docker`; skipped, naming the missing resource,
where docker cannot run): a container per session from lodestar/session-base, the gateway reachable
through the relay and nothing else, the RuntimeSpec's limits in `docker inspect`, every process gone when
the harness ends, containers removed by cleanup, by the reaper when the node is SIGKILLed, and at start.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Command, GatewayEndpoint
from lodestar_gateway.node.runtimes import DockerBackend, DockerRuntime
from lodestar_gateway.node.runtimes.base import mounts_under
from tests.docker_support import SESSION_IMAGE, containers, docker_backend, inspect, remove, skip_reason

pytestmark = [pytest.mark.docker, pytest.mark.slow]
PROBE = """
import json, socket, sys
out = {}
for target in json.loads(sys.argv[1]):
    host, port = target
    try:
        with socket.create_connection((host, port), timeout=3) as sock:
            out[f"{host}:{port}"] = "ok:" + sock.recv(64).decode()
    except OSError as error:
        out[f"{host}:{port}"] = f"error:{type(error).__name__}"
try:
    socket.getaddrinfo("example.com", 443)
    out["dns"] = "ok"
except OSError as error:
    out["dns"] = f"error:{type(error).__name__}"
print(json.dumps(out))
"""


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[DockerBackend]:
    async with docker_backend(tmp_path / "sessions", f"test-{uuid.uuid4().hex[:6]}") as made:
        yield made


def _spec(image: str = SESSION_IMAGE, **fields: Any) -> rollout_pb2.RuntimeSpec:
    return rollout_pb2.RuntimeSpec(kind="docker", image=image, **fields)


async def _banner_server(text: str, host: str = "127.0.0.1") -> asyncio.Server:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(text.encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, host, 0)


def _port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


def _host_address() -> str:
    """A non-loopback address of this machine (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent (UDP connect only picks the route)
        return str(probe.getsockname()[0])


def _command(runtime: DockerRuntime, argv: list[str], base_url: str = "http://127.0.0.1:9") -> Any:
    return runtime.translate(Command(argv).prepare(runtime.real, GatewayEndpoint(base_url, "lsk-test", "m"), "p"))


async def test_a_session_container_reaches_the_gateway_and_nothing_else(backend: DockerBackend):
    gateway, other = await _banner_server("gateway"), await _banner_server("other")
    everywhere = await _banner_server("host", host="0.0.0.0")
    host = _host_address()
    targets = [("127.0.0.1", _port(gateway)), ("127.0.0.1", _port(other)), (host, _port(everywhere)),
               ("172.17.0.1", _port(everywhere)), ("1.1.1.1", 443), ("8.8.8.8", 53)]  # fmt: skip
    reader, writer = await asyncio.open_connection(host, _port(everywhere))
    assert await reader.read(16) == b"host", "the host address serves the node: only the container is cut off"
    writer.close()
    runtime = await backend.create("iso-a1", {}, _spec())
    try:
        base_url = f"http://127.0.0.1:{_port(gateway)}"
        invocation = _command(runtime, ["{python}", "-c", PROBE, json.dumps(targets)], base_url)
        result = await runtime.run_harness(invocation, base_url, 60)
    finally:
        await runtime.cleanup()
        for server in (gateway, other, everywhere):
            server.close()
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen.pop(f"127.0.0.1:{targets[0][1]}") == "ok:gateway"
    assert seen.pop("dns").startswith("error:")
    assert all(outcome.startswith("error:") for outcome in seen.values()), seen
    assert result.isolated


async def test_limits_are_applied_and_cleanup_removes_container_files_and_mount(backend: DockerBackend):
    spec = _spec(cpus=0.5, memory_bytes=256 << 20, pids_limit=64, disk_bytes=32 << 20)
    runtime = await backend.create("limits-a1", {"task.txt": "hello"}, spec, {"session": "limits"})
    config = inspect(runtime.container)
    host: dict[str, Any] = config["HostConfig"]  # type: ignore[assignment]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 256 << 20
    assert host["PidsLimit"] == 64
    assert host["NetworkMode"] == "none"
    labels = config["Config"]["Labels"]  # type: ignore[index]
    assert labels["lodestar.session"] == "limits"
    assert backend.owner_label == f"lodestar.sessions-dir={labels['lodestar.sessions-dir']}"
    probe = "df -B1 --output=size . | tail -1; echo $(cat task.txt); pwd"
    seen = await runtime.run_process(["bash", "-c", probe], {}, 30)
    size, task, cwd = seen.stdout.split()
    assert int(size) == 32 << 20, seen.stderr
    assert (task, cwd) == ("hello", "/tmp/lodestar-session/work")
    assert mounts_under(runtime.root), "the private root is a tmpfs of disk_bytes"

    await runtime.cleanup()

    assert containers("lodestar.session=limits") == []
    assert not runtime.root.exists()
    assert not mounts_under(runtime.root)


async def test_the_harness_is_killed_at_its_limit_with_every_process_it_left(backend: DockerBackend):
    runtime = await backend.create("timeout-a1", {}, _spec())
    try:
        escape = "sleep 1000 & setsid sleep 1000 & nohup sleep 1000 >/dev/null 2>&1 & echo started; sleep 1000"
        started = time.monotonic()
        result = await runtime.run_harness(_command(runtime, ["bash", "-c", escape]), "http://127.0.0.1:9", 2)
        assert result.timed_out
        assert result.returncode == -9
        assert "started" in result.stdout
        assert time.monotonic() - started < 15
        left = await runtime.run_process(["ps", "-eo", "comm="], {}, 30)
        assert sorted(left.stdout.split()) == ["docker-init", "ps", "sleep"], left.stdout  # init + its keeper
    finally:
        await runtime.cleanup()


async def test_a_missing_image_is_a_clear_error_and_leaves_nothing(backend: DockerBackend):
    from lodestar.errors import FailedPreconditionError

    with pytest.raises(FailedPreconditionError, match="No such image"):
        await backend.create("noimage-a1", {"a": "b"}, _spec(image="lodestar/absent:never"))
    assert containers(backend.owner_label) == []
    assert not (backend.sessions_dir / "noimage-a1").exists()


async def test_leftover_containers_are_removed_when_a_node_starts(backend: DockerBackend):
    earlier = DockerBackend(backend.sessions_dir, node_id="earlier", reaper=False)
    runtime = await earlier.create("left-a1", {}, _spec())
    assert containers(backend.owner_label) != []

    assert await backend.remove_leftovers() == 1

    assert containers(backend.owner_label) == []
    await runtime.cleanup()


def test_a_node_killed_with_sigkill_loses_its_containers(tmp_path: Path):
    """The reaper child (PR_SET_PDEATHSIG) removes the containers of a node that dies without cleanup."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    sessions = tmp_path / "sessions"
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from lodestar.v1 import rollout_pb2\n"
        "from lodestar_gateway.node.runtimes import DockerBackend\n"
        "async def main():\n"
        f"    backend = DockerBackend(Path({str(sessions)!r}), node_id='doomed')\n"
        f"    spec = rollout_pb2.RuntimeSpec(kind='docker', image={SESSION_IMAGE!r})\n"
        "    runtime = await backend.create('doomed-a1', {}, spec)\n"
        "    print(runtime.container, flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    node = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd())
    label = f"lodestar.sessions-dir={os.path.realpath(sessions)}"
    try:
        assert node.stdout is not None
        container = node.stdout.readline().strip()
        assert container
        assert containers(label), "the container runs"
        node.send_signal(signal.SIGKILL)
        node.wait(timeout=10)
        deadline = time.monotonic() + 20
        while containers(label) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert containers(label) == [], "the reaper removed the dead node's container"
    finally:
        if node.poll() is None:
            node.kill()
        remove(containers(label))


async def test_a_harness_over_its_memory_limit_is_oom_killed_and_reported(backend: DockerBackend):
    spec = _spec(memory_bytes=128 << 20)
    spec.options.update({"on_limit": "infra"})
    runtime = await backend.create("oom-a1", {}, spec)
    try:
        hog = ["{python}", "-c", "blocks = [bytearray(16 << 20) for _ in range(64)]; print('survived')"]
        result = await runtime.run_harness(_command(runtime, hog), "http://127.0.0.1:9", 60)
    finally:
        await runtime.cleanup()
    assert "survived" not in result.stdout
    assert result.returncode == 137, "SIGKILLed by the kernel's OOM killer (docker exec reports 128 + 9)"
    assert runtime.limits_hit == ["memory"]
    assert runtime.limit_failure is not None
    assert "memory" in runtime.limit_failure
