"""Helpers of the loop/service tests: rollout Groups from seeded synthetic sessions, an in-memory group feed,
and a RolloutService stand-in served by a real gRPC server (StreamGroups + ReportPolicyVersion)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from typing import Any

from lodestar.grpc.server import GrpcServer, service_name
from lodestar.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from lodestar_trainer.data.synthetic import SMALL_SHAPE, synthetic_group

RUN = "run-test"
SHAPE = replace(SMALL_SHAPE, logprob_range=(-8.8, -7.8), subagent_probability=0.0)
"""Short sessions on the tiny model's vocabulary; the random tiny model gives ~-8.3 nats per token."""


def make_group(
    seed: int,
    rewards: Sequence[float] = (1.0, 0.0, 0.5, 0.0),
    *,
    run_id: str = RUN,
    group_id: str | None = None,
    outcomes: Sequence[int] | None = None,
) -> rollout_pb2.Group:
    """A Group of len(rewards) scored sessions of synthetic calls (seeded)."""
    gid = group_id or f"g{seed}"
    sessions = synthetic_group(SHAPE, group_size=len(rewards), seed=seed, group_id=gid)
    results = [
        rollout_pb2.SessionResult(
            session_id=calls[0].session_id,
            attempt=1,
            outcome=outcomes[index] if outcomes else rollout_pb2.SESSION_OUTCOME_SCORED,
            reward=reward,
            calls=calls,
        )
        for index, (calls, reward) in enumerate(zip(sessions, rewards, strict=True))
    ]
    return rollout_pb2.Group(group_id=gid, run_id=run_id, task_id=f"task-{seed}", sessions=results)


def group_from_calls(
    sessions: Sequence[Sequence[common_pb2.CallRecord]], rewards: Sequence[float], *, group_id: str
) -> rollout_pb2.Group:
    results = [
        rollout_pb2.SessionResult(
            session_id=calls[0].session_id,
            attempt=1,
            outcome=rollout_pb2.SESSION_OUTCOME_SCORED,
            reward=reward,
            calls=calls,
        )
        for calls, reward in zip(sessions, rewards, strict=True)
    ]
    versions = [call.policy_version for calls in sessions for call in calls]
    return rollout_pb2.Group(
        group_id=group_id,
        run_id=RUN,
        task_id=group_id,
        sessions=results,
        min_policy_version=min(versions),
        max_policy_version=max(versions),
    )


class FeedSource:
    """An in-memory GroupSource: serves `groups` after `start_after`, records reported versions."""

    def __init__(self, groups: list[rollout_pb2.Group]) -> None:
        self.groups_list = groups
        self.reported: list[int] = []
        self.starts: list[int] = []
        self._cancelled = threading.Event()

    def groups(self, start_after: int = 0) -> Iterator[rollout_pb2.Group]:
        self.starts.append(start_after)
        for group in self.groups_list[start_after:]:
            if self._cancelled.is_set():
                return
            yield group

    def cancel(self) -> None:
        self._cancelled.set()

    def report_policy_version(self, version: int) -> None:
        self.reported.append(version)


class RolloutStandIn(rollout_pb2_grpc.RolloutServiceServicer):
    """StreamGroups over a list of groups (then, with `hold`, waits open for more) and ReportPolicyVersion."""

    def __init__(self, groups: list[rollout_pb2.Group], *, hold: bool = False) -> None:
        self.groups = groups
        self.hold = hold
        self.requests: list[rollout_pb2.StreamGroupsRequest] = []
        self.reported: list[int] = []
        self.added = asyncio.Event()

    async def StreamGroups(
        self, request: rollout_pb2.StreamGroupsRequest, context: Any
    ) -> AsyncIterator[rollout_pb2.StreamGroupsResponse]:
        self.requests.append(request)
        index = request.start_after
        while True:
            while index < len(self.groups):  # every group, even one of another run (bad-input tests)
                index += 1
                yield rollout_pb2.StreamGroupsResponse(group=self.groups[index - 1])
            if not self.hold:
                return
            self.added.clear()
            await self.added.wait()

    async def ReportPolicyVersion(
        self, request: rollout_pb2.ReportPolicyVersionRequest, context: Any
    ) -> rollout_pb2.ReportPolicyVersionResponse:
        self.reported.append(request.policy_version)
        return rollout_pb2.ReportPolicyVersionResponse(policy_version=request.policy_version)


async def start_rollout(standin: RolloutStandIn, *, port: int = 0) -> tuple[GrpcServer, str]:
    server = GrpcServer("rollout-standin", port=port, drain_seconds=0.5)
    server.add_service(
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        standin,
        service_name(rollout_pb2.DESCRIPTOR, "RolloutService"),
    )
    bound = await server.start()
    await server.set_serving(True)
    return server, f"127.0.0.1:{bound}"
