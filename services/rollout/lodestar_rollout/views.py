"""Protobuf views of the domain state: the `Run` with its counters, assignments, and groups to send."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import timestamp_pb2

from lodestar.v1 import rollout_pb2
from lodestar_rollout.model import Group, Run, Session, SessionStatus

_STATUS_COUNTER = {
    SessionStatus.PENDING: "sessions_pending",
    SessionStatus.RUNNING: "sessions_running",
    SessionStatus.SCORED: "sessions_succeeded",
    SessionStatus.FAILED: "sessions_failed",
    SessionStatus.CANCELLED: "sessions_cancelled",
}


def run_view(run: Run, sessions: Iterable[Session], policy_version: int) -> rollout_pb2.Run:
    """The run with its counters: `sessions` are the run's live ones, `run.retired` counts the others."""
    view = rollout_pb2.Run(run_id=run.run_id, state=rollout_pb2.RunState.ValueType(run.state))
    view.policy_version = policy_version
    view.spec.CopyFrom(run.spec)
    created = timestamp_pb2.Timestamp()
    created.FromNanoseconds(int(run.created_at * 1e9))
    view.created_at.CopyFrom(created)
    counts = dict.fromkeys(_STATUS_COUNTER.values(), 0)
    for status, count in run.retired.by_status.items():
        counts[_STATUS_COUNTER[status]] += count
    total = sum(counts.values())
    scored = counts["sessions_succeeded"]
    timed_out, reward_sum, ready = run.retired.timed_out, run.retired.reward_sum, 0
    for session in sessions:
        total += 1
        counts[_STATUS_COUNTER[session.status]] += 1
        if session.status is SessionStatus.RUNNING and session.stage == rollout_pb2.SESSION_STAGE_READY:
            ready += 1
        if session.status is SessionStatus.SCORED:
            scored += 1
            reward_sum += session.reward
            timed_out += session.outcome == rollout_pb2.SESSION_OUTCOME_TIMED_OUT
    for name, value in counts.items():
        setattr(view, name, value)
    view.sessions_total = total
    view.sessions_ready = ready
    view.sessions_timed_out = timed_out
    view.reward_mean = reward_sum / scored if scored else 0.0
    view.groups_complete = run.groups_completed
    view.groups_delivered = run.groups_delivered
    view.groups_dropped = run.groups_dropped
    view.infra_failures = run.infra_failures
    for name, total_s in run.stage_sums.items():
        view.stage_seconds_mean[name] = total_s / max(run.stage_counts.get(name, 1), 1)
    return view


def assignment(session: Session, run: Run) -> rollout_pb2.SessionAssignment:
    spec = run.spec
    return rollout_pb2.SessionAssignment(
        session_id=session.session_id,
        run_id=run.run_id,
        group_id=session.group_id,
        attempt=session.attempt,
        task=spec.tasks[session.task_index],
        harness=spec.harness,
        verifier=spec.verifier,
        session_timeout=spec.session_timeout,
        agent_timeout=spec.agent_timeout,
        runtime=spec.runtime,
        sampling=spec.sampling,
    )


def strip_bodies(result: rollout_pb2.SessionResult) -> None:
    """tokens_only: drop each call's request body and canonical chat (token ids and logprobs stay)."""
    for call in result.calls:
        call.ClearField("original_request_json")
        call.ClearField("messages")
        call.ClearField("tools")


def group_response(
    group: Group, run: Run, results: list[rollout_pb2.SessionResult]
) -> rollout_pb2.StreamGroupsResponse:
    """The group as the stream sends it, built in place: its results (a group's bulk, tens of KB even
    tokens-only) are copied once, into the response, not into a `Group` and then with it into the response."""
    response = rollout_pb2.StreamGroupsResponse()
    message = response.group
    message.group_id, message.run_id = group.group_id, run.run_id
    message.task_id = run.spec.tasks[group.task_index].task_id
    message.min_policy_version, message.max_policy_version = group.min_policy_version, group.max_policy_version
    message.sessions.extend(results)
    return response
