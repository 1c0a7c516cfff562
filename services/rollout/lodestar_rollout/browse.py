"""Read-only protobuf views for dashboards and tools: session and group summaries, attempts, and a page of a
session's result (ListGroups, GetSessionDetail, ListFailedAttempts). Pure: domain state in, messages out."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import timestamp_pb2

from lodestar.v1 import rollout_pb2
from lodestar_rollout import views
from lodestar_rollout.model import AttemptRecord, Group, GroupStatus, Run, Session, SessionStatus, StoredResult

_SESSION_STATUS = {
    SessionStatus.PENDING: rollout_pb2.SESSION_STATUS_PENDING,
    SessionStatus.RUNNING: rollout_pb2.SESSION_STATUS_RUNNING,
    SessionStatus.SCORED: rollout_pb2.SESSION_STATUS_SCORED,
    SessionStatus.FAILED: rollout_pb2.SESSION_STATUS_FAILED,
    SessionStatus.CANCELLED: rollout_pb2.SESSION_STATUS_CANCELLED,
}
_GROUP_STATUS = {
    GroupStatus.OPEN: rollout_pb2.GROUP_STATUS_OPEN,
    GroupStatus.COMPLETE: rollout_pb2.GROUP_STATUS_COMPLETE,
    GroupStatus.FAILED: rollout_pb2.GROUP_STATUS_FAILED,
    GroupStatus.CANCELLED: rollout_pb2.GROUP_STATUS_CANCELLED,
}


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def session_summary(session: Session, run: Run) -> rollout_pb2.SessionSummary:
    return rollout_pb2.SessionSummary(
        session_id=session.session_id,
        run_id=session.run_id,
        group_id=session.group_id,
        task_id=run.spec.tasks[session.task_index].task_id,
        sample=session.sample,
        status=_SESSION_STATUS[session.status],
        attempt=session.attempt,
        failures=session.failures,
        node_id=session.node_id,
        stage=rollout_pb2.SessionStage.ValueType(session.stage),
        outcome=rollout_pb2.SessionOutcome.ValueType(session.outcome),
        reward=session.reward,
        min_policy_version=session.min_policy_version,
        max_policy_version=session.max_policy_version,
    )


def group_summary(group: Group, run: Run, sessions: Iterable[Session]) -> rollout_pb2.GroupSummary:
    """The group with its sessions (given in sample order)."""
    return rollout_pb2.GroupSummary(
        group_id=group.group_id,
        task_id=run.spec.tasks[group.task_index].task_id,
        status=_GROUP_STATUS[group.status],
        completion_seq=group.completion_seq,
        delivery_seq=group.delivery_seq,
        dropped=group.dropped,
        min_policy_version=group.min_policy_version,
        max_policy_version=group.max_policy_version,
        sessions=[session_summary(session, run) for session in sessions],
    )


def attempt_summary(record: AttemptRecord) -> rollout_pb2.AttemptSummary:
    summary = rollout_pb2.AttemptSummary(
        attempt=record.attempt,
        node_id=record.node_id,
        acquired_at=_timestamp(record.acquired_at),
        outcome=record.outcome,
        error=record.error,
        stage_seconds=record.stage_seconds,
    )
    if record.ended_at:
        summary.ended_at.CopyFrom(_timestamp(record.ended_at))
    return summary


def failed_attempt(record: AttemptRecord) -> rollout_pb2.FailedAttempt:
    return rollout_pb2.FailedAttempt(
        session_id=record.session_id,
        attempt=record.attempt,
        node_id=record.node_id,
        outcome=record.outcome,
        error=record.error,
        ended_at=_timestamp(record.ended_at),
    )


def session_detail(
    summary: rollout_pb2.SessionSummary,
    attempts: Iterable[AttemptRecord],
    shown: StoredResult | None,
    request: rollout_pb2.GetSessionDetailRequest,
) -> rollout_pb2.GetSessionDetailResponse:
    """The session, its attempts and its shown result cut to the requested page of calls."""
    reply = rollout_pb2.GetSessionDetailResponse(
        session=summary, attempts=[attempt_summary(record) for record in attempts]
    )
    if shown is None:
        return reply
    result = shown.result
    reply.call_count = len(result.calls)
    end = request.call_offset + request.call_limit if request.call_limit else len(result.calls)
    page = list(result.calls[request.call_offset : end])
    del result.calls[:]
    result.calls.extend(page)
    if request.calls_without_bodies:
        views.strip_bodies(result)
    reply.result.CopyFrom(result)
    return reply
