"""TLS and the control-plane token on real servers: a rollout leader (real etcd, real SQLite) and a
scripted inference process, both with mutual TLS and a bearer token (certificates from lodestar.tls), and
a gateway node with a token.

A client without a certificate fails the handshake; a call without the token (a run, its groups, a
session, a weight update) is UNAUTHENTICATED and changes nothing; health and reflection stay open; with
both the calls work. The secure defaults around them are in test_secure_defaults.py."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
import safetensors.torch
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from lodestar.etcd import EtcdClient
from lodestar.grpc import security
from lodestar.grpc.security import Security, needs_token
from lodestar.tls import LocalPki, ensure_local_pki
from lodestar.v1 import (
    gateway_pb2,
    gateway_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    trainer_pb2,
)
from lodestar_app.local import free_port, wait_serving
from lodestar_inference.tiny_model import TinyModelSpec, build
from lodestar_trainer.rpc import sync_channel
from tests.rollout.helpers import Rollout, make_spec, settings, start_rollout

TOKEN = "s3cret-control-plane-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return ensure_local_pki(tmp_path_factory.mktemp("pki"))


def _identity(pki: LocalPki, name: str, *, token: str | None = TOKEN, cert: bool = True) -> Security:
    identity = pki.identities[name]
    if not cert:
        return Security(tls_ca=pki.ca, token=token)
    return Security(identity.cert, identity.key, pki.ca, token)


@pytest.fixture
def secured(pki: LocalPki) -> Iterator[Security]:
    """The process's security: the rollout's certificate, the CA and the token (reset afterwards)."""
    before = security.current()
    security.configure(_identity(pki, "rollout"))
    try:
        yield security.current()
    finally:
        security.configure(before)


@pytest.fixture
async def rollout(secured: Security, tmp_path: Path, etcd_endpoint: str, etcd_prefix: str) -> AsyncIterator[Rollout]:
    async with start_rollout(settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix)) as started:
        yield started


def test_every_lodestar_method_but_the_open_ones_needs_the_token() -> None:
    """Deny by default: every method of every lodestar service needs the token but generation, model info and
    node counters; health and reflection never do."""
    open_methods = {
        "/lodestar.v1.InferenceService/Generate",
        "/lodestar.v1.InferenceService/GenerateMany",
        "/lodestar.v1.InferenceService/CountTokens",
        "/lodestar.v1.InferenceService/GetModelInfo",
        "/lodestar.v1.GatewayService/GetNodeStatus",
    }
    every = {
        f"/{service.full_name}/{rpc.name}"
        for module in (gateway_pb2, inference_pb2, rollout_pb2, trainer_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for rpc in service.methods
    }
    assert open_methods < every
    for method in every - open_methods:  # sessions, runs, groups, weights, checkpoints, policy versions
        assert needs_token(method), method
    for method in open_methods:
        assert not needs_token(method), method
    for method in ("/lodestar.v1.RolloutService/GetRun", "/lodestar.v1.RolloutService/StreamGroups",
                   "/lodestar.v1.GatewayService/OpenSession", "/lodestar.v1.GatewayService/GetSession",
                   "/lodestar.v1.TrainerService/SaveCheckpoint", "/lodestar.v2.RolloutService/Anything"):  # fmt: skip
        assert needs_token(method), method
    assert not needs_token("/grpc.health.v1.Health/Check")
    assert not needs_token("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")


async def test_a_client_without_a_certificate_fails_the_handshake(rollout: Rollout, pki: LocalPki) -> None:
    for client in (Security(), _identity(pki, "client", cert=False)):  # plaintext; TLS without a client cert
        async with client.aio_channel(rollout.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert rollout.core.scheduler.runs == {}


async def test_without_the_token_the_control_plane_refuses_and_nothing_changes(
    rollout: Rollout, pki: LocalPki, etcd_endpoint: str
) -> None:
    async with EtcdClient(etcd_endpoint) as etcd:
        lease = await etcd.grant_lease(30)
        await _refusals(rollout, pki, lease.id)


async def _refusals(rollout: Rollout, pki: LocalPki, lease_id: int) -> None:
    async with _identity(pki, "client", token=None).aio_channel(rollout.address) as channel:
        anonymous = rollout_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await anonymous.CreateRun(rollout_pb2.CreateRunRequest(spec=make_spec(tasks=1, group_size=2)))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert rollout.core.scheduler.runs == {}

        run_id = await rollout.create_run(make_spec(tasks=1, group_size=2))  # the token holder can
        # Reads need the token too: a run carries its harness env (API keys) and tasks (gold patches).
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await anonymous.GetRun(rollout_pb2.GetRunRequest(run_id=run_id))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in anonymous.StreamGroups(rollout_pb2.StreamGroupsRequest(run_id=run_id)):
                pass
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for call in (
            anonymous.AcquireSessions(
                rollout_pb2.AcquireSessionsRequest(node_id="thief", lease_id=lease_id, free_slots=4)
            ),
            anonymous.CancelRun(rollout_pb2.CancelRunRequest(run_id=run_id)),
            anonymous.CompleteSession(rollout_pb2.CompleteSessionRequest()),
            anonymous.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=99)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        run = await rollout.get_run(run_id)
        assert run.state == rollout_pb2.RUN_STATE_RUNNING
        assert run.sessions_running == 0
        assert rollout.core.scheduler.sessions[f"{run_id}-g0-s0"].attempt == 0  # no session was handed out
        assert rollout.core.scheduler.policy_version == 0

        wrong = Security(pki.identities["client"].cert, pki.identities["client"].key, pki.ca, "wrong-token")
        async with wrong.aio_channel(rollout.address) as wrong_channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await rollout_pb2_grpc.RolloutServiceStub(wrong_channel).CancelRun(
                    rollout_pb2.CancelRunRequest(run_id=run_id)
                )
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        async for reply in reflection:
            names = {service.name for service in reply.list_services_response.service}
            assert "lodestar.v1.RolloutService" in names
            break

    authorized = await rollout.stub.AcquireSessions(
        rollout_pb2.AcquireSessionsRequest(node_id="n", lease_id=lease_id, free_slots=4)
    )
    assert [s.attempt for s in authorized.sessions] == [1, 1]


async def test_the_trainers_sync_channel_carries_tls_and_the_token(rollout: Rollout, secured: Security) -> None:
    def create() -> rollout_pb2.CreateRunResponse:
        with sync_channel(rollout.address) as channel:
            return rollout_pb2_grpc.RolloutServiceStub(channel).CreateRun(
                rollout_pb2.CreateRunRequest(spec=make_spec(tasks=1, group_size=1)), timeout=10
            )

    reply = await asyncio.to_thread(create)
    assert reply.run.run_id in rollout.core.scheduler.runs


@pytest.fixture
async def inference(pki: LocalPki, tmp_path: Path) -> AsyncIterator[str]:
    """`lodestar inference serve --backend scripted` with mutual TLS and the token, as a process."""
    model = build(tmp_path / "tiny-model", TinyModelSpec())
    port = free_port()
    identity = pki.identities["inference"]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = [sys.executable, "-m", "lodestar_app.cli.main", "inference", "serve", "--backend", "scripted"]
    argv += ["--model", str(model)]
    argv += ["--port", str(port), "--tls-cert", str(identity.cert)]
    argv += ["--tls-key", str(identity.key), "--tls-ca", str(pki.ca), "--auth-token-file", str(token_file)]
    log = (tmp_path / "inference.log").open("wb")
    process = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
    before = security.current()
    security.configure(_identity(pki, "client", token=None))
    try:
        await wait_serving(f"127.0.0.1:{port}", 60, process)
        yield f"127.0.0.1:{port}"
    finally:
        security.configure(before)
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(20):
            await process.wait()
        log.close()


@pytest.mark.slow
async def test_update_weights_without_the_token_leaves_the_policy(inference: str, pki: LocalPki) -> None:
    async with _identity(pki, "client", token=None).aio_channel(inference) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        before = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=10)
        payload = safetensors.torch.save({"w": torch.zeros(4)})
        header = inference_pb2.WeightsHeader(total_bytes=len(payload), policy_version=7)
        requests = [
            inference_pb2.UpdateWeightsRequest(header=header),
            inference_pb2.UpdateWeightsRequest(chunk=payload),
        ]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.UpdateWeights(iter(requests), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "bearer token" in (refused.value.details() or "")
        after = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=10)
        assert after.policy_version.version == before.policy_version.version == 0
    async with _identity(pki, "trainer").aio_channel(inference) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        reply = await stub.UpdateWeights(iter(requests), timeout=10)
        assert reply.policy_version == 7
        assert (await stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=10)).policy_version.version == 7


class _NoInference:
    """The gateway test below opens sessions only: no call reaches inference."""

    def generate(self, request: object) -> object:
        raise AssertionError("no generation expected")

    async def count_tokens(self, request: object) -> int:
        raise AssertionError("no token count expected")

    async def model_info(self) -> object:
        raise AssertionError("no model info expected")


async def test_a_gateway_with_a_token_refuses_session_rpcs_without_it(tmp_path: Path) -> None:
    """OpenSession hands out a key that spends inference and GetSession returns a session's calls (prompts,
    completions): with a token configured, both need it (and CloseSession); the node's counters stay open."""
    from lodestar_gateway.server import GatewayNode
    from lodestar_gateway.settings import GatewaySettings

    before = security.current()
    security.configure(Security(token=TOKEN))
    try:
        node = GatewayNode(GatewaySettings(port=0, http_port=0, data_dir=tmp_path), inference=_NoInference())  # type: ignore[arg-type]
        await node.start()
    finally:
        security.configure(before)
    try:
        async with Security().aio_channel(node.grpc_address) as channel:
            anonymous = gateway_pb2_grpc.GatewayServiceStub(channel)
            for call in (
                anonymous.OpenSession(gateway_pb2.OpenSessionRequest(run_id="r"), timeout=10),
                anonymous.GetSession(gateway_pb2.GetSessionRequest(session_id="ses_x"), timeout=10),
                anonymous.CloseSession(gateway_pb2.CloseSessionRequest(session_id="ses_x"), timeout=10),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert node.sessions.open_count == 0
            status = await anonymous.GetNodeStatus(gateway_pb2.GetNodeStatusRequest(), timeout=10)
            assert status.open_sessions == 0
        async with Security(token=TOKEN).aio_channel(node.grpc_address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            opened = await stub.OpenSession(gateway_pb2.OpenSessionRequest(run_id="r"), timeout=10)
            shown = await stub.GetSession(gateway_pb2.GetSessionRequest(session_id=opened.session.session_id))
            assert shown.session.session_id == opened.session.session_id
            status = await stub.GetNodeStatus(gateway_pb2.GetNodeStatusRequest(), timeout=10)
            assert status.open_sessions == 1
    finally:
        await node.stop(0)
