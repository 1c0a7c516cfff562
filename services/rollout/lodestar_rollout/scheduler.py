"""Leased pull scheduling of sessions (pure domain: no gRPC, no etcd, no SQLite).

Sessions are task x sample index. `acquire` hands a node up to `free_slots` pending sessions, oldest
run first, then oldest group (task order) first, so started groups finish before new ones begin, and
starts a new group only while `groups.admits_new_group` (rollout must not outrun the trainer); each
hand-out is a new attempt. `complete` is fenced: only the current attempt, reported by the node that
holds it, counts. SCORED and TIMED_OUT count toward the group; INFRA_FAILED and a lost attempt (the
node's lease ended, or the node stopped listing it in `in_flight` for `MISSED_POLLS_LIMIT` polls) requeue
the session as a new attempt until `max_attempts` failures, after which the session FAILS (never a
reward). A session a node reports CANCELLED on its own (the node drains on SIGTERM) is requeued without counting
a failure. Group completion and the group stream live in `groups`.

Every operation returns `Changes` for the store; the caller persists them and deletes released keys,
then calls `forget_done` so that done groups (and their sessions) leave memory: memory holds the work in
flight, the store everything.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from lodestar.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from lodestar.policy_versions import call_version_range
from lodestar.v1 import rollout_pb2
from lodestar_rollout import groups
from lodestar_rollout.model import (
    AttemptRecord,
    Changes,
    Group,
    Run,
    Session,
    SessionStatus,
    StoredResult,
)
from lodestar_rollout.spec import required_scored

MISSED_POLLS_LIMIT = 2
"""Polls in a row whose `in_flight` omits a running attempt before it is treated as lost."""

_OUTCOME_NAMES = {
    rollout_pb2.SESSION_OUTCOME_SCORED: "scored",
    rollout_pb2.SESSION_OUTCOME_TIMED_OUT: "timed_out",
    rollout_pb2.SESSION_OUTCOME_INFRA_FAILED: "infra_failed",
    rollout_pb2.SESSION_OUTCOME_CANCELLED: "cancelled",
}


@dataclass(frozen=True)
class Progress:
    """One attempt a node says it holds (`SessionProgress`)."""

    session_id: str
    attempt: int
    stage: int = rollout_pb2.SESSION_STAGE_UNSPECIFIED


@dataclass
class Acquisition:
    assigned: list[Session] = field(default_factory=list)
    cancelled: list[tuple[str, int]] = field(default_factory=list)
    changes: Changes = field(default_factory=Changes)


def _duration_s(duration: object) -> float:
    seconds = getattr(duration, "seconds", 0)
    nanos = getattr(duration, "nanos", 0)
    return float(seconds) + float(nanos) / 1e9


def stage_seconds(result: rollout_pb2.SessionResult) -> dict[str, float]:
    """Seconds per lifecycle stage reported by a result (stages the node left unset are omitted)."""
    stages: dict[str, float] = {}
    if result.HasField("init_duration"):
        stages["init"] = _duration_s(result.init_duration)
    if result.HasField("ready_duration"):
        stages["ready"] = _duration_s(result.ready_duration)
    if result.HasField("agent_duration"):
        stages["run"] = _duration_s(result.agent_duration)
    if result.HasField("post_duration"):
        stages["post"] = _duration_s(result.post_duration)
    if result.HasField("session_duration"):
        stages["session"] = _duration_s(result.session_duration)
    return stages


def ended_attempt_answer(session: Session, result: rollout_pb2.SessionResult) -> tuple[bool, Changes] | None:
    """The answer to a result for an attempt that already ended (None: it is the running attempt).

    A repeated report of a scored or failed attempt gets the first answer (idempotent); a late report of an
    attempt cancelled meanwhile is recorded, not counted; FailedPreconditionError for a superseded attempt or
    a node that does not hold the session. Also used for sessions that left memory (read from the store).
    """
    if result.outcome not in _OUTCOME_NAMES:
        raise InvalidArgumentError("result outcome is unspecified")
    same_attempt = session.attempt == result.attempt and session.node_id == result.node_id
    if same_attempt and session.status in (SessionStatus.SCORED, SessionStatus.FAILED):
        return session.counted, Changes()
    if same_attempt and session.status is SessionStatus.CANCELLED:
        return False, Changes(results=[StoredResult(result, counted=False)])  # late, recorded, not counted
    if not same_attempt or session.status is not SessionStatus.RUNNING:
        raise FailedPreconditionError(
            f"attempt {result.attempt} of session {result.session_id} from node {result.node_id!r} is not "
            f"the current one (current: attempt {session.attempt} on {session.node_id or 'no node'}, "
            f"{session.status.value})"
        )
    return None


class Scheduler:
    """All runs, groups and sessions of the service, and the queue of pending sessions."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        """Every run of the store (finished ones as summaries)."""
        self.groups: dict[str, Group] = {}
        """Live groups: open, or complete and not yet delivered or dropped."""
        self.sessions: dict[str, Session] = {}
        """The sessions of live groups."""
        self.policy_version = 0
        self._queues: dict[str, list[tuple[int, int, str]]] = {}
        """run id -> its pending sessions, a heap in (task, sample) order (stale entries skipped)."""
        self._queued: set[str] = set()
        self._held: dict[str, set[str]] = {}
        """node id -> sessions that node runs."""
        self._cancels: dict[str, dict[tuple[str, int], None]] = {}
        """node id -> attempts to tell it to stop (ordered, unique)."""

    # -- state loading -----------------------------------------------------------------------------

    def add_run(self, run_id: str, spec: rollout_pb2.RunSpec, created_at: float) -> Changes:
        """Create a run of `spec` (already validated, defaults filled): one group per task."""
        ordinal = max((run.ordinal for run in self.runs.values()), default=0) + 1
        run = Run(run_id=run_id, ordinal=ordinal, spec=spec, created_at=created_at)
        self.runs[run_id] = run
        required = required_scored(spec)
        changes = Changes(created={run_id}, runs={run_id})
        for task_index in range(len(spec.tasks)):
            group_id = f"{run_id}-g{task_index}"
            session_ids = [f"{group_id}-s{sample}" for sample in range(spec.group_size)]
            self.groups[group_id] = Group(group_id, run_id, task_index, session_ids, required)
            run.group_ids[group_id] = None
            changes.groups.add(group_id)
            for sample, session_id in enumerate(session_ids):
                self.sessions[session_id] = Session(session_id, run_id, group_id, task_index, sample)
                self._enqueue(self.sessions[session_id])
                changes.sessions.add(session_id)
        return changes

    def restore(self, runs: Iterable[Run], group_list: Iterable[Group], sessions: Iterable[Session]) -> None:
        """Load state read back from the store (a restart or a new leader): every run, the live groups and
        their sessions (each run's `retired` tally counts the rest)."""
        self.runs = {run.run_id: run for run in runs}
        self.groups = {group.group_id: group for group in group_list}
        self.sessions = {session.session_id: session for session in sessions}
        self._held.clear()
        for session in self.sessions.values():
            if session.status is SessionStatus.RUNNING:
                self._held.setdefault(session.node_id, set()).add(session.session_id)
            if session.status is SessionStatus.PENDING:
                self._enqueue(session)
        for run in self.runs.values():
            groups.restore_delivery(self, run)

    def _enqueue(self, session: Session) -> None:
        if session.session_id in self._queued:
            return
        queue = self._queues.setdefault(session.run_id, [])
        heapq.heappush(queue, (session.task_index, session.sample, session.session_id))
        self._queued.add(session.session_id)

    def report_policy_version(self, version: int) -> Changes:
        """The trainer's policy version now; running runs learn the trainer's pace from it."""
        self.policy_version = version
        changes = Changes(policy_version=version)
        for run in self.runs.values():
            if not run.finished and groups.observe_policy_version(run, version):
                changes.runs.add(run.run_id)
        return changes

    def run(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise NotFoundError(f"no run {run_id!r}")
        return run

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise NotFoundError(f"no session {session_id!r}")
        return session

    def running(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.status is SessionStatus.RUNNING]

    # -- acquire -----------------------------------------------------------------------------------

    def acquire(
        self, node_id: str, lease_id: int, free_slots: int, in_flight: Iterable[Progress], now: float
    ) -> Acquisition:
        """Update stages from `in_flight`, collect what the node must stop, then hand out work."""
        if not node_id:
            raise InvalidArgumentError("node_id is required")
        if lease_id <= 0 and free_slots > 0:
            raise FailedPreconditionError("lease_id is required to acquire sessions (register the node first)")
        result = Acquisition()
        cancels = self._cancels.pop(node_id, {})
        seen: set[str] = set()
        for item in in_flight:
            session = self.sessions.get(item.session_id)
            held = session is not None and session.status is SessionStatus.RUNNING
            if session is None or not held or session.owner != (node_id, item.attempt):
                cancels[(item.session_id, item.attempt)] = None
                continue
            seen.add(session.session_id)
            session.missed_polls = 0
            if item.stage != session.stage:
                session.stage = item.stage
        for session_id in list(self._held.get(node_id, ())):
            if session_id in seen:
                continue
            session = self.sessions[session_id]
            session.missed_polls += 1
            if session.missed_polls >= MISSED_POLLS_LIMIT:
                cancels[(session_id, session.attempt)] = None
                result.changes.merge(self.lose(session_id, session.attempt, "the node no longer lists it", now))
        result.cancelled = list(cancels)
        for run in self.runs.values():  # oldest run first
            queue = self._queues.get(run.run_id)
            while queue and len(result.assigned) < free_slots:
                session = self.sessions.get(queue[0][2])  # None: cancelled while queued, and forgotten since
                if session is not None and session.status is SessionStatus.PENDING and not run.finished:
                    group = self.groups[session.group_id]
                    if not group.started and not groups.admits_new_group(run):
                        break  # the trainer is behind: start no new group of this run for now
                    self._assign(session, node_id, lease_id, now, result.changes)
                    result.assigned.append(session)
                self._queued.discard(heapq.heappop(queue)[2])
        return result

    def _assign(self, session: Session, node_id: str, lease_id: int, now: float, changes: Changes) -> None:
        group = self.groups[session.group_id]
        if not group.started:
            group.started = True
            self.runs[session.run_id].groups_in_play += 1
        session.status = SessionStatus.RUNNING
        session.attempt += 1
        session.node_id, session.lease_id = node_id, lease_id
        session.stage = rollout_pb2.SESSION_STAGE_UNSPECIFIED
        session.missed_polls = 0
        session.acquired_at = now
        self._held.setdefault(node_id, set()).add(session.session_id)
        changes.sessions.add(session.session_id)
        changes.attempts.append(AttemptRecord(session.session_id, session.attempt, node_id, lease_id, now))

    def revert(self, assigned: Iterable[Session]) -> None:
        """Undo a hand-out whose ownership keys could not be written (nothing of it was persisted)."""
        for session in assigned:
            self._release(session)
            if session.status is SessionStatus.RUNNING:
                session.status = SessionStatus.PENDING
                session.attempt -= 1
                session.node_id, session.lease_id = "", 0
                self._enqueue(session)

    def _release(self, session: Session) -> None:
        held = self._held.get(session.node_id)
        if held is not None:
            held.discard(session.session_id)
            if not held:
                del self._held[session.node_id]

    # -- complete ----------------------------------------------------------------------------------

    def complete(self, result: rollout_pb2.SessionResult, now: float) -> tuple[bool, Changes]:
        """Record a node's result; returns whether it counts toward its group, and the changes.

        FailedPreconditionError for a superseded attempt or a node that does not hold the session.
        A repeated report of an attempt that already ended returns the first answer (idempotent).
        """
        session = self.session(result.session_id)
        answered = ended_attempt_answer(session, result)
        if answered is not None:
            return answered
        run = self.runs[session.run_id]
        changes = Changes(runs={run.run_id}, sessions={session.session_id})
        changes.released.append((session.session_id, session.attempt))
        self._release(session)
        seconds = stage_seconds(result)
        for name, value in seconds.items():
            run.stage_sums[name] = run.stage_sums.get(name, 0.0) + value
            run.stage_counts[name] = run.stage_counts.get(name, 0) + 1
        outcome = _OUTCOME_NAMES[result.outcome]
        changes.attempts.append(
            AttemptRecord(
                session.session_id,
                session.attempt,
                session.node_id,
                session.lease_id,
                session.acquired_at,
                now,
                outcome,
                result.error,
                seconds,
            )
        )
        counted = False
        if result.outcome in (rollout_pb2.SESSION_OUTCOME_SCORED, rollout_pb2.SESSION_OUTCOME_TIMED_OUT):
            versions = [version for call in result.calls for version in call_version_range(call)]
            session.status, session.outcome, session.reward = SessionStatus.SCORED, result.outcome, result.reward
            session.min_policy_version, session.max_policy_version = min(versions, default=0), max(versions, default=0)
            session.counted = counted = True
        elif result.outcome == rollout_pb2.SESSION_OUTCOME_INFRA_FAILED:
            run.infra_failures += 1
            self._fail_attempt(session, run, changes)
        else:  # the node handed it back (a drain): run it again elsewhere, no attempt spent
            self._requeue(session)
        changes.results.append(StoredResult(result, counted))
        changes.merge(groups.settle(self, session.group_id))
        return counted, changes

    def forget_done(self, group_ids: Iterable[str]) -> None:
        """Drop the done ones of `group_ids` and their sessions from memory (their counts go to the run's
        `retired` tally). Call it once their rows were snapshotted for the store: the store answers for them
        from then on."""
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if group is None or not group.done:
                continue
            run = self.runs[group.run_id]
            for session_id in group.session_ids:
                session = self.sessions.pop(session_id)
                run.retired.add(session.status, session.outcome, session.reward)
                self._queued.discard(session_id)
            del self.groups[group_id]
            del run.group_ids[group_id]
            if run.finished and not run.group_ids:  # a summary now: drop what its live state allocated
                run.group_ids, run.completion_order = {}, deque()
                self._queues.pop(run.run_id, None)

    def delete_run(self, run_id: str) -> None:
        """Forget a finished run entirely (its store rows are deleted by the caller); FailedPreconditionError
        for a running run (cancel it first)."""
        run = self.run(run_id)
        if not run.finished:
            raise FailedPreconditionError(f"run {run_id} is running: cancel it before deleting it")
        for group_id in list(run.group_ids):  # complete groups nobody streamed
            for session_id in self.groups.pop(group_id).session_ids:
                del self.sessions[session_id]
                self._queued.discard(session_id)
        self._queues.pop(run_id, None)
        del self.runs[run_id]

    def _fail_attempt(self, session: Session, run: Run, changes: Changes) -> None:
        session.failures += 1
        if session.failures >= run.spec.max_attempts:
            session.status = SessionStatus.FAILED
        else:
            self._requeue(session)
        changes.sessions.add(session.session_id)

    def _requeue(self, session: Session) -> None:
        session.status = SessionStatus.PENDING
        session.stage = rollout_pb2.SESSION_STAGE_UNSPECIFIED
        self._enqueue(session)

    def lose(self, session_id: str, attempt: int, reason: str, now: float) -> Changes:
        """The node of a running attempt is gone (lease ended) or dropped it: requeue or fail it."""
        session = self.sessions.get(session_id)
        if session is None or session.status is not SessionStatus.RUNNING or session.attempt != attempt:
            return Changes()
        run = self.runs[session.run_id]
        changes = Changes(runs={run.run_id})
        changes.released.append((session_id, attempt))
        changes.attempts.append(
            AttemptRecord(
                session_id, attempt, session.node_id, session.lease_id, session.acquired_at, now, "lost", reason
            )
        )
        self._release(session)
        self._fail_attempt(session, run, changes)
        changes.merge(groups.settle(self, session.group_id))
        return changes

    # -- cancellation ------------------------------------------------------------------------------

    def cancel_session(self, session: Session, changes: Changes) -> None:
        """Stop a live session (its group completed, or its run was cancelled)."""
        if session.status is SessionStatus.RUNNING:
            self._cancels.setdefault(session.node_id, {})[(session.session_id, session.attempt)] = None
            changes.released.append((session.session_id, session.attempt))
            self._release(session)
        session.status = SessionStatus.CANCELLED
        changes.sessions.add(session.session_id)

    def cancel_run(self, run_id: str) -> Changes:
        """Cancel every live session of the run; its complete groups stay deliverable."""
        run = self.run(run_id)
        if run.finished:
            return Changes()
        run.state = rollout_pb2.RUN_STATE_CANCELLED
        return groups.cancel_open(self, run)

    # -- reconciliation ----------------------------------------------------------------------------

    def reconcile(self, owners: dict[tuple[str, int], str], now: float) -> tuple[Changes, list[tuple[str, int]]]:
        """Compare running attempts with the ownership keys found in etcd ((session, attempt) -> node).

        A running attempt without its key is lost (requeued or failed); returns the changes and the keys
        that belong to no running attempt (stale, to delete).
        """
        changes = Changes()
        for session in self.running():
            if owners.get((session.session_id, session.attempt)) != session.node_id:
                changes.merge(self.lose(session.session_id, session.attempt, "ownership key missing in etcd", now))
        stale = []
        for (session_id, attempt), node_id in owners.items():
            found = self.sessions.get(session_id)
            if found is None or found.status is not SessionStatus.RUNNING or found.owner != (node_id, attempt):
                stale.append((session_id, attempt))
        return changes, stale
