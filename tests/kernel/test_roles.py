"""Credentials per role on real gRPC servers (`lodestar.grpc.roles`, `lodestar.grpc.auth`): a rollout leader
(real etcd, real SQLite) and an inference server (scripted engine) checking a token table with an operator,
a trainer and two node tokens.

- A node's token acquires and completes only its own node's sessions: naming another node is PERMISSION_DENIED
  and changes nothing; it cannot create, read or cancel runs, read groups or push weights.
- The trainer reads groups, reports its policy version and pushes weights; it cannot create or cancel runs
  or take sessions. The operator creates and cancels runs and cannot take sessions or push weights.
- A missing or unknown token is UNAUTHENTICATED; health stays open. Every lodestar RPC is in the one table
  or open; a bad token table fails with its line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import safetensors.torch
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar.errors import InvalidArgumentError
from lodestar.etcd import EtcdClient
from lodestar.grpc import security
from lodestar.grpc.roles import METHOD_ROLES, OPEN_METHODS, Role, TokenTable, token_line
from lodestar.grpc.security import Security
from lodestar.v1 import gateway_pb2, inference_pb2, inference_pb2_grpc, rollout_pb2, rollout_pb2_grpc, trainer_pb2
from lodestar_app.cli.main import main
from lodestar_inference.server import build_server
from lodestar_inference.service import InferenceService
from lodestar_inference.settings import InferenceSettings
from lodestar_inference.tiny_model import TinyModelSpec, build
from tests.rollout.helpers import Rollout, make_spec, session_result, settings, start_rollout

TOKENS = {
    "operator": "operator-token-0123456789",
    "trainer": "trainer-token-0123456789",
    "node:a": "node-a-token-0123456789",
    "node:b": "node-b-token-0123456789",
}
TABLE = "\n".join(token_line(role, token, hashed=role != "operator") for role, token in TOKENS.items())
DENIED, UNAUTHENTICATED = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture
def table_security() -> Iterator[Security]:
    """Servers started now check the table; this process's own calls carry the operator's token."""
    before = security.current()
    security.configure(Security(token=TOKENS["operator"], table=TokenTable.parse(TABLE)))
    try:
        yield security.current()
    finally:
        security.configure(before)


@pytest.fixture
async def rollout(
    table_security: Security, tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> AsyncIterator[Rollout]:
    async with start_rollout(settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix)) as started:
        yield started


def stub_as(role: str | None, address: str) -> tuple[grpc.aio.Channel, rollout_pb2_grpc.RolloutServiceStub]:
    channel = Security(token=TOKENS[role] if role else None).aio_channel(address)
    return channel, rollout_pb2_grpc.RolloutServiceStub(channel)


async def code_of(call: Any) -> grpc.StatusCode:
    """The status a unary or streaming call ends with (OK when it succeeds)."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def test_a_node_token_acts_only_for_its_own_node(rollout: Rollout, etcd_endpoint: str) -> None:
    run_id = await rollout.create_run(make_spec(tasks=1, group_size=2))  # the operator can
    async with EtcdClient(etcd_endpoint) as etcd:
        lease_a, lease_b = await etcd.grant_lease(30), await etcd.grant_lease(30)
        channel_a, node_a = stub_as("node:a", rollout.address)
        channel_b, node_b = stub_as("node:b", rollout.address)
        async with channel_a, channel_b:
            as_b = rollout_pb2.AcquireSessionsRequest(node_id="b", lease_id=lease_b.id, free_slots=1)
            assert await code_of(node_a.AcquireSessions(as_b)) == DENIED  # a posing as b
            assert rollout.core.scheduler.sessions[f"{run_id}-g0-s0"].attempt == 0
            (held_by_b,) = (await node_b.AcquireSessions(as_b)).sessions
            (held_by_a,) = (
                await node_a.AcquireSessions(
                    rollout_pb2.AcquireSessionsRequest(node_id="a", lease_id=lease_a.id, free_slots=1)
                )
            ).sessions
            # a reports b's session: as b it is refused by its token; as itself, by the scheduler (not the holder).
            forged = session_result(held_by_b.session_id, held_by_b.attempt, "b", reward=1.0)
            assert await code_of(node_a.CompleteSession(rollout_pb2.CompleteSessionRequest(result=forged))) == DENIED
            own_name = session_result(held_by_b.session_id, held_by_b.attempt, "a", reward=1.0)
            request = rollout_pb2.CompleteSessionRequest(result=own_name)
            assert await code_of(node_a.CompleteSession(request)) == grpc.StatusCode.FAILED_PRECONDITION
            assert rollout.core.scheduler.sessions[held_by_b.session_id].counted is False
            # Its own session it completes; nothing else of the control plane is its.
            mine = session_result(held_by_a.session_id, held_by_a.attempt, "a", reward=0.5)
            assert (await node_a.CompleteSession(rollout_pb2.CompleteSessionRequest(result=mine))).counted
            for call in (
                node_a.CreateRun(rollout_pb2.CreateRunRequest(spec=make_spec(tasks=1, group_size=1))),
                node_a.GetRun(rollout_pb2.GetRunRequest(run_id=run_id)),
                node_a.CancelRun(rollout_pb2.CancelRunRequest(run_id=run_id)),
                node_a.StreamGroups(rollout_pb2.StreamGroupsRequest(run_id=run_id)),
                node_a.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=9)),
                node_a.ListRuns(rollout_pb2.ListRunsRequest()),
            ):
                assert await code_of(call) == DENIED
    run = await rollout.get_run(run_id)
    assert run.state == rollout_pb2.RUN_STATE_RUNNING
    assert rollout.core.scheduler.policy_version == 0


async def test_the_trainer_and_the_operator_each_have_their_own_rpcs(rollout: Rollout, etcd_endpoint: str) -> None:
    channel, trainer = stub_as("trainer", rollout.address)
    async with channel:
        spec = make_spec(tasks=1, group_size=1)
        assert await code_of(trainer.CreateRun(rollout_pb2.CreateRunRequest(spec=spec))) == DENIED
        assert rollout.core.scheduler.runs == {}
        run_id = await rollout.create_run(spec)
        assert await code_of(trainer.CancelRun(rollout_pb2.CancelRunRequest(run_id=run_id))) == DENIED
        assert await code_of(trainer.DeleteRun(rollout_pb2.DeleteRunRequest(run_id=run_id))) == DENIED
        take = rollout_pb2.AcquireSessionsRequest(node_id="a", lease_id=1, free_slots=1)
        assert await code_of(trainer.AcquireSessions(take)) == DENIED
        reported = await trainer.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest(policy_version=3))
        assert reported.policy_version == 3
        groups = trainer.StreamGroups(rollout_pb2.StreamGroupsRequest(run_id=run_id, max_groups=1), timeout=0.5)
        assert await code_of(groups) == grpc.StatusCode.DEADLINE_EXCEEDED  # allowed: waits for a group
    # The operator (this process's token) creates and cancels runs, and cannot act as a node or the trainer.
    assert await code_of(rollout.stub.AcquireSessions(take)) == DENIED
    assert await code_of(rollout.stub.ReportPolicyVersion(rollout_pb2.ReportPolicyVersionRequest())) == DENIED
    assert (await rollout.stub.CancelRun(rollout_pb2.CancelRunRequest(run_id=run_id))).run.run_id == run_id


async def test_a_missing_or_unknown_token_is_unauthenticated_and_health_is_open(rollout: Rollout) -> None:
    for role in (None, "unknown"):
        channel = Security(token="not-a-known-token-at-all" if role else None).aio_channel(rollout.address)
        async with channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            assert await code_of(stub.GetRun(rollout_pb2.GetRunRequest(run_id="x"))) == UNAUTHENTICATED
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
async def inference(table_security: Security, tmp_path: Path) -> AsyncIterator[str]:
    """An in-process inference server (scripted engine over the tiny model) checking the token table."""
    config = InferenceSettings(port=0, backend="scripted", model=build(tmp_path / "model", TinyModelSpec()))
    service = InferenceService.create(config)
    server = build_server(config, service)
    port = await server.start()
    await service.start()
    await server.set_serving(True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)
        await service.close()


@pytest.mark.slow
async def test_only_the_trainer_pushes_weights(inference: str) -> None:
    payload = safetensors.torch.save({"w": torch.zeros(4)})
    header = inference_pb2.WeightsHeader(total_bytes=len(payload), policy_version=7)
    requests = [inference_pb2.UpdateWeightsRequest(header=header), inference_pb2.UpdateWeightsRequest(chunk=payload)]
    for role in ("node:a", "operator"):
        async with Security(token=TOKENS[role]).aio_channel(inference) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            assert await code_of(stub.UpdateWeights(iter(requests), timeout=10)) == DENIED
            info = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=10)  # open
            assert info.policy_version.version == 0
    async with Security(token=TOKENS["trainer"]).aio_channel(inference) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        assert (await stub.UpdateWeights(iter(requests), timeout=10)).policy_version == 7


def test_every_lodestar_rpc_is_in_the_table_or_open() -> None:
    every = {
        f"/{service.full_name}/{rpc.name}"
        for module in (gateway_pb2, inference_pb2, rollout_pb2, trainer_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for rpc in service.methods
    }
    assert every == set(METHOD_ROLES) | OPEN_METHODS
    assert not set(METHOD_ROLES) & OPEN_METHODS
    # No role but the trainer changes weights; no role but a node takes or reports sessions.
    assert METHOD_ROLES["/lodestar.v1.InferenceService/UpdateWeights"] == {Role.TRAINER}
    assert METHOD_ROLES["/lodestar.v1.RolloutService/CompleteSession"] == {Role.NODE}


def test_a_bad_token_table_names_its_line() -> None:
    for text, message in (
        ("node,trainer tok-0123456789abcdef", "node role alone"),
        ("admin tok-0123456789abcdef", "unknown role 'admin'"),
        ("operator short", "at least 16"),
        ("operator sha256:abc", "64 hex"),
        ("operator", "expected"),
        ("operator tok-0123456789abcdef\ntrainer tok-0123456789abcdef", "line 2: the same token"),
        ("# nothing\n", "empty"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            TokenTable.parse(text)
    table = TokenTable.parse("operator,trainer tok-0123456789abcdef  # one person who trains\n")
    principal = table.principal(b"tok-0123456789abcdef")
    assert principal is not None
    assert principal.roles == {Role.OPERATOR, Role.TRAINER}
    assert table.principal(b"tok-0123456789abcdeX") is None


def test_auth_tokens_keeps_what_it_made_and_adds_a_node(tmp_path: Path) -> None:
    """`lodestar auth tokens`: a token file per role (0600) and the digest table the servers read, which
    holds no token; run again with another node it keeps the tokens and adds the node."""
    assert main(["auth", "tokens", str(tmp_path), "--node", "gw-1"]) == 0
    operator = (tmp_path / "operator.token").read_text().strip()
    assert (tmp_path / "operator.token").stat().st_mode & 0o777 == 0o600
    assert main(["auth", "tokens", str(tmp_path), "--node", "gw-1", "--node", "gw-2"]) == 0
    assert (tmp_path / "operator.token").read_text().strip() == operator
    text = (tmp_path / "tokens.sha256").read_text()
    assert operator not in text
    table = TokenTable.read(tmp_path / "tokens.sha256")
    for name, role, identity in (("operator", Role.OPERATOR, None), ("node-gw-2", Role.NODE, "gw-2")):
        principal = table.principal((tmp_path / f"{name}.token").read_text().strip().encode())
        assert principal is not None
        assert (principal.roles, principal.identity) == ({role}, identity)
