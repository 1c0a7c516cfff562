"""RolloutService over gRPC: translates requests to `RolloutCore` calls and back.

While this instance is not the leader every RPC answers UNAVAILABLE with the leader's address in the
message and in the trailing metadata `lodestar-leader` (plus `grpc-retry-pushback-ms: -1`, so gRPC's
own retry policy does not retry the follower); `lodestar.grpc.client.call_following_leader` retries
there. A node's token acts only for its own node id (`lodestar.grpc.auth.check_node`: PERMISSION_DENIED).
A redirect to a caller that went away before it was answered (grpc cannot send the status) is one info line,
and the call ends cancelled (not an INTERNAL error with a traceback: issue 44, docs/chaos.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio

from lodestar.grpc.auth import check_node
from lodestar.grpc.client import LEADER_METADATA_KEY
from lodestar.grpc.errors import send_status
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_rollout.scheduler import Progress
from lodestar_rollout.service import RolloutCore

Context = grpc.aio.ServicerContext[Any, Any]
_log = get_logger("rollout.servicer")


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, core: Callable[[], RolloutCore | None], leader_address: Callable[[], str | None]) -> None:
        self._core = core
        self._leader_address = leader_address

    async def _leading(self, context: Context) -> RolloutCore:
        core = self._core()
        if core is not None:
            return core
        leader = self._leader_address()
        metadata: list[tuple[str, str]] = [("grpc-retry-pushback-ms", "-1")]
        if leader:
            metadata.append((LEADER_METADATA_KEY, leader))
        where = f"the leader is at {leader}" if leader else "no leader is elected yet, retry shortly"
        await send_status(
            context,
            grpc.StatusCode.UNAVAILABLE,
            f"not the rollout leader: {where}",
            tuple(metadata),
            log=_log,
            leader=leader or None,
        )

    async def CreateRun(self, request: rollout_pb2.CreateRunRequest, context: Context) -> rollout_pb2.CreateRunResponse:
        core = await self._leading(context)
        return rollout_pb2.CreateRunResponse(run=await core.create_run(request.spec))

    async def GetRun(self, request: rollout_pb2.GetRunRequest, context: Context) -> rollout_pb2.GetRunResponse:
        core = await self._leading(context)
        return rollout_pb2.GetRunResponse(run=core.run_view(request.run_id))

    async def CancelRun(self, request: rollout_pb2.CancelRunRequest, context: Context) -> rollout_pb2.CancelRunResponse:
        core = await self._leading(context)
        return rollout_pb2.CancelRunResponse(run=await core.cancel_run(request.run_id))

    async def DeleteRun(self, request: rollout_pb2.DeleteRunRequest, context: Context) -> rollout_pb2.DeleteRunResponse:
        core = await self._leading(context)
        await core.delete_run(request.run_id)
        return rollout_pb2.DeleteRunResponse(run_id=request.run_id)

    async def ArchiveRun(
        self, request: rollout_pb2.ArchiveRunRequest, context: Context
    ) -> rollout_pb2.ArchiveRunResponse:
        core = await self._leading(context)
        archived = await core.archive_run(request.run_id)
        return rollout_pb2.ArchiveRunResponse(
            run_id=request.run_id, path=str(archived.path), sessions=archived.sessions, records=archived.records
        )

    async def AcquireSessions(
        self, request: rollout_pb2.AcquireSessionsRequest, context: Context
    ) -> rollout_pb2.AcquireSessionsResponse:
        check_node(request.node_id)  # a node token acts only for its own node
        core = await self._leading(context)
        in_flight = [Progress(item.session_id, item.attempt, item.stage) for item in request.in_flight]
        sessions, cancelled = await core.acquire(request.node_id, request.lease_id, request.free_slots, in_flight)
        return rollout_pb2.AcquireSessionsResponse(
            sessions=sessions,
            cancelled=[rollout_pb2.SessionAttemptRef(session_id=sid, attempt=attempt) for sid, attempt in cancelled],
        )

    async def CompleteSession(
        self, request: rollout_pb2.CompleteSessionRequest, context: Context
    ) -> rollout_pb2.CompleteSessionResponse:
        check_node(request.result.node_id)  # and the scheduler takes only the holder's result
        core = await self._leading(context)
        return rollout_pb2.CompleteSessionResponse(counted=await core.complete(request.result))

    async def StreamGroups(
        self, request: rollout_pb2.StreamGroupsRequest, context: Context
    ) -> AsyncIterator[rollout_pb2.StreamGroupsResponse]:
        core = await self._leading(context)
        stream = core.stream_groups(
            request.run_id, request.start_after, tokens_only=request.tokens_only, max_groups=request.max_groups
        )
        async for response in stream:
            yield response

    async def ReportPolicyVersion(
        self, request: rollout_pb2.ReportPolicyVersionRequest, context: Context
    ) -> rollout_pb2.ReportPolicyVersionResponse:
        core = await self._leading(context)
        version = await core.report_policy_version(request.policy_version)
        return rollout_pb2.ReportPolicyVersionResponse(policy_version=version)

    async def ListRuns(self, request: rollout_pb2.ListRunsRequest, context: Context) -> rollout_pb2.ListRunsResponse:
        core = await self._leading(context)
        return rollout_pb2.ListRunsResponse(runs=core.list_runs(request.limit))

    async def ListGroups(
        self, request: rollout_pb2.ListGroupsRequest, context: Context
    ) -> rollout_pb2.ListGroupsResponse:
        core = await self._leading(context)
        return rollout_pb2.ListGroupsResponse(groups=await core.list_groups(request.run_id))

    async def GetSessionDetail(
        self, request: rollout_pb2.GetSessionDetailRequest, context: Context
    ) -> rollout_pb2.GetSessionDetailResponse:
        core = await self._leading(context)
        return await core.session_detail(request)

    async def ListFailedAttempts(
        self, request: rollout_pb2.ListFailedAttemptsRequest, context: Context
    ) -> rollout_pb2.ListFailedAttemptsResponse:
        core = await self._leading(context)
        return rollout_pb2.ListFailedAttemptsResponse(
            attempts=await core.failed_attempts(request.run_id, request.limit)
        )
