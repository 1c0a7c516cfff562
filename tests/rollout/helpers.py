"""Test helpers of the rollout tests: a rollout server in-process, specs, session results, simulated gateway
nodes, and the CLI run as its own process.

A `SimNode` is test code standing in for a gateway node: it holds a real etcd lease and calls the real
RPCs (AcquireSessions with its in-flight attempts, CompleteSession with a result it makes up).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc.aio

from lodestar.etcd import EtcdClient, Lease
from lodestar.grpc.client import connect
from lodestar.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from lodestar_rollout.server import RolloutServer
from lodestar_rollout.settings import RolloutSettings
from tests.waiting import eventually

SCORED = rollout_pb2.SESSION_OUTCOME_SCORED
TIMED_OUT = rollout_pb2.SESSION_OUTCOME_TIMED_OUT
INFRA_FAILED = rollout_pb2.SESSION_OUTCOME_INFRA_FAILED
CANCELLED = rollout_pb2.SESSION_OUTCOME_CANCELLED


def make_spec(tasks: int = 2, group_size: int = 2, **fields: Any) -> rollout_pb2.RunSpec:
    fields.setdefault("harness", rollout_pb2.HarnessSpec(kind="command", command=["python", "agent.py", "{prompt}"]))
    fields.setdefault("verifier", rollout_pb2.VerifierSpec(kind="exact_match"))
    spec = rollout_pb2.RunSpec(name="test", group_size=group_size, **fields)
    for index in range(tasks):
        spec.tasks.add(task_id=f"task-{index}", prompt=f"say {index}")
    return spec


def session_result(
    session_id: str, attempt: int, node: str, outcome: int = SCORED, reward: float = 1.0, versions: tuple[int, ...] = ()
) -> rollout_pb2.SessionResult:
    """The result `node` reports for `attempt` of a session, with one call per policy version in `versions`."""
    result = rollout_pb2.SessionResult(
        session_id=session_id, attempt=attempt, node_id=node, outcome=outcome, reward=reward
    )
    for version in versions:
        result.calls.add(session_id=session_id, policy_version=version)
    return result


async def run_lodestar(*argv: str) -> tuple[int, str, str]:
    """Run the CLI as its own process (the in-process service logs to this one's stdout): (exit code, stdout,
    stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lodestar_app.cli.main",
        *argv,
        stdout=PIPE,
        stderr=PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


def settings(store: Path | str, etcd: str, prefix: str, **fields: Any) -> RolloutSettings:
    values: dict[str, Any] = {
        "port": 0,
        "etcd": etcd,
        "etcd_prefix": prefix,
        "store": store,
        "leader_ttl_s": 2,
        "drain_seconds": 0.5,
    }
    values.update(fields)
    return RolloutSettings(**values)


@dataclass
class Rollout:
    """A started in-process rollout server and a stub on it."""

    server: RolloutServer
    channel: grpc.aio.Channel
    stub: rollout_pb2_grpc.RolloutServiceStub
    address: str

    @property
    def core(self) -> Any:
        return self.server.role.core

    async def create_run(self, spec: rollout_pb2.RunSpec) -> str:
        reply = await self.stub.CreateRun(rollout_pb2.CreateRunRequest(spec=spec))
        return reply.run.run_id

    async def get_run(self, run_id: str) -> rollout_pb2.Run:
        return (await self.stub.GetRun(rollout_pb2.GetRunRequest(run_id=run_id))).run

    async def groups(
        self,
        run_id: str,
        start_after: int = 0,
        *,
        tokens_only: bool = False,
        limit: int = 0,
        max_groups: int = 0,
        timeout: float = 20,
    ) -> list[rollout_pb2.Group]:
        """Read the group stream until it ends (or `limit` groups arrived: then the reader hangs up)."""
        request = rollout_pb2.StreamGroupsRequest(
            run_id=run_id, start_after=start_after, tokens_only=tokens_only, max_groups=max_groups
        )
        out: list[rollout_pb2.Group] = []
        call = self.stub.StreamGroups(request, timeout=timeout)
        async for reply in call:
            out.append(reply.group)
            if limit and len(out) >= limit:
                call.cancel()
                break
        return out


async def wait_leading(server: RolloutServer, timeout: float = 20.0) -> None:
    await eventually(lambda: server.role.core is not None, timeout, interval_s=0.02, what="the rollout server leading")


@contextlib.asynccontextmanager
async def start_rollout(config: RolloutSettings, *, lead: bool = True) -> AsyncIterator[Rollout]:
    server = RolloutServer(config)
    port = await server.start()
    channel = connect(f"127.0.0.1:{port}")
    try:
        if lead:
            await wait_leading(server)
        yield Rollout(server, channel, rollout_pb2_grpc.RolloutServiceStub(channel), f"127.0.0.1:{port}")
    finally:
        await channel.close()
        await server.stop(0)


def call_record(session_id: str, sequence: int = 0, policy_version: int = 0, body: str = "{}") -> common_pb2.CallRecord:
    return common_pb2.CallRecord(
        session_id=session_id,
        sequence=sequence,
        original_request_json=body,
        messages=[
            common_pb2.ChatMessage(
                role=common_pb2.ROLE_USER, content=[common_pb2.ContentPart(text=common_pb2.TextPart(text="hi"))]
            )
        ],
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        completion_logprobs=[-0.5, -0.25],
        policy_version=policy_version,
    )


@dataclass
class SimNode:
    """A simulated gateway node: a real etcd lease, real AcquireSessions / CompleteSession calls."""

    node_id: str
    stub: rollout_pb2_grpc.RolloutServiceStub
    lease: Lease
    held: dict[str, rollout_pb2.SessionAssignment] = field(default_factory=dict)
    cancelled: list[tuple[str, int]] = field(default_factory=list)
    stages: dict[str, int] = field(default_factory=dict)

    def in_flight(self) -> list[rollout_pb2.SessionProgress]:
        return [
            rollout_pb2.SessionProgress(session_id=sid, attempt=a.attempt, stage=self.stages.get(sid, 3))
            for sid, a in self.held.items()
        ]

    async def acquire(self, free_slots: int, *, report: bool = True) -> list[rollout_pb2.SessionAssignment]:
        request = rollout_pb2.AcquireSessionsRequest(
            node_id=self.node_id,
            lease_id=self.lease.id,
            free_slots=free_slots,
            in_flight=self.in_flight() if report else [],
        )
        reply = await self.stub.AcquireSessions(request)
        for ref in reply.cancelled:
            self.cancelled.append((ref.session_id, ref.attempt))
            held = self.held.get(ref.session_id)
            if held is not None and held.attempt == ref.attempt:
                del self.held[ref.session_id]
        for assignment in reply.sessions:
            self.held[assignment.session_id] = assignment
        return list(reply.sessions)

    async def complete(
        self,
        assignment: rollout_pb2.SessionAssignment,
        outcome: int = SCORED,
        reward: float = 1.0,
        calls: list[common_pb2.CallRecord] | None = None,
        **fields: Any,
    ) -> bool:
        result = rollout_pb2.SessionResult(
            session_id=assignment.session_id,
            attempt=assignment.attempt,
            node_id=self.node_id,
            outcome=outcome,
            reward=reward,
            calls=calls if calls is not None else [call_record(assignment.session_id)],
            **fields,
        )
        reply = await self.stub.CompleteSession(rollout_pb2.CompleteSessionRequest(result=result), timeout=60)
        self.held.pop(assignment.session_id, None)
        return reply.counted


@contextlib.asynccontextmanager
async def sim_node(
    etcd: EtcdClient, stub: rollout_pb2_grpc.RolloutServiceStub, node_id: str, ttl: int = 2
) -> AsyncIterator[SimNode]:
    lease = await etcd.grant_lease(ttl)
    try:
        yield SimNode(node_id, stub, lease)
    finally:
        with contextlib.suppress(Exception):
            await lease.revoke()
