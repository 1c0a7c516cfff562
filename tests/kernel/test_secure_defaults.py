"""Secure defaults of every gRPC server (docs/security.md, "Secure defaults"), on real servers bound to real ports:

- a server bound beyond loopback with neither a token nor mutual TLS refuses to start (in-process and as a
  `lodestar ... serve` process, which exits 2 before binding) unless `--allow-insecure` says otherwise, and
  then it says so loudly; a token, or a CA that makes TLS mutual, is enough; loopback needs neither;
- a gateway given a plaintext http:// etcd beyond loopback exits 2 unless `--etcd-allow-insecure`;
- a rollout bound to 0.0.0.0 without a token does not start; with one, an unauthenticated CreateRun is refused
  and creates nothing;
- each server accepts requests up to its own `max_receive_message_bytes` (a rollout takes a CompleteSession
  of tens of MB, a gateway or a trainer 4 MiB) and refuses larger ones before any handler runs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
import structlog

from lodestar.errors import FailedPreconditionError
from lodestar.grpc import security
from lodestar.grpc.client import connect
from lodestar.grpc.security import Security, is_loopback
from lodestar.grpc.server import GrpcServer
from lodestar.settings import ServiceSettings
from lodestar.tls import LocalPki, ensure_local_pki
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_app.local import free_port, wait_serving
from lodestar_gateway.settings import GatewaySettings
from lodestar_inference.settings import InferenceSettings
from lodestar_rollout.server import RolloutServer
from lodestar_rollout.settings import RolloutSettings
from lodestar_trainer.settings import TrainerSettings
from tests.kernel.faulty_service import SERVICE, FaultyService, method
from tests.rollout.helpers import make_spec, settings, start_rollout

REPO = Path(__file__).resolve().parents[2]
TOKEN = "a-token-for-the-secure-defaults"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return ensure_local_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def with_token() -> Iterator[Security]:
    """The process's security: a token only (plaintext), reset afterwards."""
    before = security.current()
    security.configure(Security(token=TOKEN))
    try:
        yield security.current()
    finally:
        security.configure(before)


def faulty_server(settings: ServiceSettings, server_security: Security | None = None) -> GrpcServer:
    server = GrpcServer.for_settings("faulty", settings, security=server_security)
    handler = FaultyService().handler()
    server.add_service(lambda h, grpc_server: grpc_server.add_generic_rpc_handlers((h,)), handler, SERVICE)
    return server


def test_loopback_addresses() -> None:
    for host in ("127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "[::]", "", "10.0.0.7", "lodestar-gateway", "example.com"):
        assert not is_loopback(host), host


async def test_beyond_loopback_without_a_token_or_mutual_tls_a_server_refuses_to_start(pki: LocalPki) -> None:
    identity = pki.identities["rollout"]
    for refused in (Security(), Security(identity.cert, identity.key)):  # plaintext; TLS without client certs
        with pytest.raises(FailedPreconditionError, match="--allow-insecure"):
            faulty_server(ServiceSettings(host="0.0.0.0"), refused)
        with pytest.raises(FailedPreconditionError, match="without authentication"):
            faulty_server(ServiceSettings(host="::"), refused)

    for accepted, host in (
        (Security(token=TOKEN), "0.0.0.0"),  # a token
        (Security(identity.cert, identity.key, pki.ca), "0.0.0.0"),  # mutual TLS
        (Security(), "127.0.0.1"),  # loopback needs neither
    ):
        server = faulty_server(ServiceSettings(host=host), accepted)
        assert await server.start() > 0
        await server.stop(0)


async def test_allow_insecure_serves_beyond_loopback_and_says_so() -> None:
    server = faulty_server(ServiceSettings(host="0.0.0.0", allow_insecure=True), Security())
    with structlog.testing.capture_logs() as logs:
        port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await method(channel, "Unary")(b"ok:open", timeout=5) == b"open"
    finally:
        await server.stop(0)
    assert any("WITHOUT authentication" in entry["event"] for entry in logs)
    quiet = faulty_server(ServiceSettings(host="127.0.0.1", allow_insecure=True), Security())
    with structlog.testing.capture_logs() as logs:
        await quiet.start()
    await quiet.stop(0)
    assert not any("WITHOUT authentication" in entry["event"] for entry in logs)


def _serve(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "lodestar_app.cli.main", "gateway", "serve", "--http-port", "0"]
    argv += ["--data-dir", str(tmp_path / "gateway"), *flags]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LODESTAR_")} | (env or {})
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)


async def _refused(process: subprocess.Popen[bytes], what: str) -> str:
    """The stderr of a `serve` process that must exit with code 2 (fails the test if it keeps serving)."""
    try:
        _, stderr = await asyncio.to_thread(process.communicate, timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"{what} kept serving")
    assert process.returncode == 2, stderr.decode()
    return stderr.decode()


@pytest.mark.slow
async def test_a_service_process_bound_beyond_loopback_without_a_token_exits_before_binding(tmp_path: Path) -> None:
    port = free_port()
    stderr = await _refused(_serve(tmp_path, "--host", "0.0.0.0", "--port", str(port)), "a gateway on 0.0.0.0")
    assert "refusing to serve gateway gRPC on 0.0.0.0" in stderr
    assert "--allow-insecure" in stderr

    for flags, env in (
        (["--allow-insecure"], {}),
        ([], {"LODESTAR_GATEWAY_AUTH_TOKEN": TOKEN}),
    ):
        port = free_port()
        served = _serve(tmp_path, "--host", "0.0.0.0", "--port", str(port), *flags, env=env)
        try:
            await wait_serving(f"127.0.0.1:{port}", 60)
        finally:
            served.terminate()
            await asyncio.to_thread(served.communicate, timeout=30)


@pytest.mark.slow
async def test_a_gateway_with_plaintext_etcd_beyond_loopback_exits_before_serving(tmp_path: Path) -> None:
    """etcd's secure default (tests/kernel/test_etcd_tls.py has the rest): http:// beyond loopback needs
    --etcd-allow-insecure."""
    refused = _serve(tmp_path, "--port", str(free_port()), "--etcd", "http://10.0.0.7:2379")
    stderr = await _refused(refused, "a gateway with a plaintext etcd beyond loopback")
    assert "refusing plaintext etcd at http://10.0.0.7:2379" in stderr
    assert "--etcd-allow-insecure" in stderr


async def test_an_unauthenticated_create_run_on_a_non_loopback_bind_is_refused(
    with_token: Security, tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    config = settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix, host="0.0.0.0")
    before = security.current()
    security.configure(Security())  # no token: the rollout does not even start
    try:
        with pytest.raises(FailedPreconditionError, match=r"refusing to serve rollout gRPC on 0\.0\.0\.0"):
            RolloutServer(config)
    finally:
        security.configure(before)
    async with start_rollout(config) as rollout:  # with the token
        async with grpc.aio.insecure_channel(rollout.address) as channel:
            anonymous = rollout_pb2_grpc.RolloutServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await anonymous.CreateRun(rollout_pb2.CreateRunRequest(spec=make_spec(tasks=1, group_size=2)))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert rollout.core.scheduler.runs == {}
        assert await rollout.create_run(make_spec(tasks=1, group_size=2))  # with the token (the helper's channel)


def test_each_service_sizes_its_receive_limit() -> None:
    gateway, inference = GatewaySettings(), InferenceSettings()
    assert gateway.max_receive_message_bytes == TrainerSettings().max_receive_message_bytes == 4 * MiB
    assert ServiceSettings().max_receive_message_bytes == 4 * MiB
    assert inference.max_receive_message_bytes >= gateway.max_body_bytes + 4 * MiB  # a proxied body + token ids
    assert RolloutSettings().max_receive_message_bytes >= 64 * MiB  # CompleteSession: tens of MB


@pytest.fixture
async def limited() -> AsyncIterator[dict[str, str]]:
    """Faulty servers with a gateway's, a rollout's and a 64 KiB receive limit: their addresses by name."""
    servers = {
        "gateway": faulty_server(GatewaySettings(port=0)),
        "rollout": faulty_server(RolloutSettings(port=0)),
        "tiny": faulty_server(ServiceSettings(max_receive_message_bytes=64 * 1024)),
    }
    addresses = {name: f"127.0.0.1:{await server.start()}" for name, server in servers.items()}
    try:
        yield addresses
    finally:
        for server in servers.values():
            await server.stop(0)


@pytest.mark.slow
async def test_a_request_above_a_servers_receive_limit_is_refused(limited: dict[str, str]) -> None:
    async def send(name: str, size: int) -> bytes:
        channel = connect(limited[name])  # the client side sends and receives up to 256 MiB
        try:
            reply: bytes = await method(channel, "Unary")(b"ok:" + b"x" * size, timeout=60)
            return reply
        finally:
            await channel.close()

    assert len(await send("tiny", 32 * 1024)) == 32 * 1024
    assert len(await send("gateway", 3 * MiB)) == 3 * MiB
    assert len(await send("rollout", 40 * MiB)) == 40 * MiB  # a session of hundreds of 100 KB calls
    for name, size in (("tiny", 100 * 1024), ("gateway", 5 * MiB)):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await send(name, size)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, name
