"""The rollout domain state: runs, groups (one per task) and sessions (task x sample), plus `Changes`,
the record of what one scheduler operation changed, which the store persists in one transaction.

The scheduler keeps the live part of this state in memory (it is the source of truth while the service
leads) and the store holds a durable copy of all of it, from which a restarted or newly elected leader
rebuilds the live part. A group is live while it is open or complete but not yet delivered or dropped;
once it is done (delivered, dropped, failed, cancelled) it and its sessions leave memory and the run keeps
only their counts (`SessionTally`). A finished run whose groups are all done is a summary: the `Run` alone.
Result bodies (CallRecords) never live here: they go straight to the store and are read back when a group
is sent.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from lodestar.v1 import rollout_pb2

STAGE_NAMES = ("init", "ready", "run", "post", "session")


class SessionStatus(enum.StrEnum):
    PENDING = "pending"
    """Waiting to be handed out (never run, or requeued after a failed/lost attempt)."""
    RUNNING = "running"
    """Handed to a node as attempt `attempt`; its ownership key lives in etcd."""
    SCORED = "scored"
    """Finished with a reward (SCORED or TIMED_OUT)."""
    FAILED = "failed"
    """Given up after `max_attempts` failed attempts (infrastructure failures or lost nodes): no reward."""
    CANCELLED = "cancelled"
    """Not needed any more: its group completed early, or the run was cancelled."""


LIVE = (SessionStatus.PENDING, SessionStatus.RUNNING)


class GroupStatus(enum.StrEnum):
    OPEN = "open"
    COMPLETE = "complete"
    """Enough sessions scored (or none can still score and at least one did): deliverable."""
    FAILED = "failed"
    """No session of the group scored and none can any more: nothing to deliver."""
    CANCELLED = "cancelled"
    """The run was cancelled before the group completed."""


@dataclass
class Session:
    session_id: str
    run_id: str
    group_id: str
    task_index: int
    sample: int
    status: SessionStatus = SessionStatus.PENDING
    attempt: int = 0
    """The latest attempt handed out (0: never); a result must echo it while the session is RUNNING."""
    failures: int = 0
    """Attempts that failed (infrastructure failure or lost node); at max_attempts the session fails."""
    node_id: str = ""
    lease_id: int = 0
    stage: int = rollout_pb2.SESSION_STAGE_UNSPECIFIED
    missed_polls: int = 0
    """Consecutive polls of its node whose in_flight did not list the running attempt."""
    outcome: int = rollout_pb2.SESSION_OUTCOME_UNSPECIFIED
    reward: float = 0.0
    counted: bool = False
    min_policy_version: int = 0
    max_policy_version: int = 0
    acquired_at: float = 0.0

    @property
    def owner(self) -> tuple[str, int]:
        return (self.node_id, self.attempt)


@dataclass
class Group:
    group_id: str
    run_id: str
    task_index: int
    session_ids: list[str]
    required: int
    """Scored sessions that complete the group: ceil(early_stop_fraction x group_size)."""
    status: GroupStatus = GroupStatus.OPEN
    completion_seq: int = 0
    """1-based order of completion within the run (0 while open or when nothing is delivered)."""
    delivery_seq: int = 0
    """1-based position in the run's group stream, fixed when first decided (0: not yet decided)."""
    dropped: bool = False
    """Decided too stale to deliver (against the latest reported policy version)."""
    min_policy_version: int = 0
    max_policy_version: int = 0
    started: bool = False
    """Some session of it was handed out (derived, not stored)."""

    @property
    def done(self) -> bool:
        """Nothing more can happen to it: delivered, dropped, failed or cancelled (it may leave memory)."""
        return self.status in (GroupStatus.FAILED, GroupStatus.CANCELLED) or self.delivery_seq > 0 or self.dropped


@dataclass
class SessionTally:
    """Counts of a run's sessions that left memory with their done groups (the run's counters add them)."""

    by_status: dict[SessionStatus, int] = field(default_factory=dict)
    timed_out: int = 0
    reward_sum: float = 0.0
    """Sum of the rewards of scored sessions."""

    def add(self, status: SessionStatus, outcome: int, reward: float, count: int = 1) -> None:
        """Count `count` sessions of `status` and `outcome` whose rewards sum to `reward`."""
        self.by_status[status] = self.by_status.get(status, 0) + count
        if status is SessionStatus.SCORED:
            self.reward_sum += reward
            if outcome == rollout_pb2.SESSION_OUTCOME_TIMED_OUT:
                self.timed_out += count


@dataclass
class Run:
    run_id: str
    ordinal: int
    """Creation order: older runs are served first."""
    spec: rollout_pb2.RunSpec
    """The spec with defaults filled in."""
    created_at: float
    state: int = rollout_pb2.RUN_STATE_RUNNING
    group_ids: dict[str, None] = field(default_factory=dict)
    """The run's groups in memory (live), in task order (an ordered set)."""
    groups_completed: int = 0
    groups_delivered: int = 0
    groups_dropped: int = 0
    infra_failures: int = 0
    stage_sums: dict[str, float] = field(default_factory=dict)
    stage_counts: dict[str, int] = field(default_factory=dict)
    finished_at: float = 0.0
    """When the run completed or was cancelled (0 while running): retention counts from here."""
    batch_estimate: float = 0.0
    """Groups the trainer takes per policy version (0: unknown, no admission control)."""
    version_mark: tuple[int, int] = (0, 0)
    """(policy version, groups delivered) when the version was last reported."""
    # Derived, in memory only (rebuilt on load): the group stream, admission control, counts of done groups.
    completion_order: deque[str] = field(default_factory=deque)
    """Complete groups whose fate (delivered or dropped) is not fixed yet, by completion sequence."""
    groups_in_play: int = 0
    """Groups started and not yet delivered, dropped, failed or cancelled."""
    retired: SessionTally = field(default_factory=SessionTally)
    """Sessions of the run's done groups (no longer in memory)."""

    @property
    def finished(self) -> bool:
        return self.state != rollout_pb2.RUN_STATE_RUNNING


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a session as stored (upserted by (session_id, attempt))."""

    session_id: str
    attempt: int
    node_id: str
    lease_id: int
    acquired_at: float
    ended_at: float = 0.0
    outcome: str = ""
    """'' while running; scored, timed_out, infra_failed, cancelled, lost."""
    error: str = ""
    stage_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredResult:
    """A node's report of one attempt, kept with every CallRecord; `counted` says whether it scored."""

    result: rollout_pb2.SessionResult
    counted: bool


@dataclass
class Changes:
    """What one operation changed: the store persists these; the service deletes the owner keys."""

    created: set[str] = field(default_factory=set)
    """Runs created by this operation (their spec is written once)."""
    runs: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    sessions: set[str] = field(default_factory=set)
    attempts: list[AttemptRecord] = field(default_factory=list)
    results: list[StoredResult] = field(default_factory=list)
    released: list[tuple[str, int]] = field(default_factory=list)
    """Ownership keys to delete: (session_id, attempt) of running attempts that ended here."""
    group_events: set[str] = field(default_factory=set)
    """Runs whose group stream may have something new (a group completed, the run ended)."""
    policy_version: int | None = None
    """The latest policy version, when this operation set it."""

    def merge(self, other: Changes) -> None:
        self.created |= other.created
        self.runs |= other.runs
        self.groups |= other.groups
        self.sessions |= other.sessions
        self.attempts.extend(other.attempts)
        self.results.extend(other.results)
        self.released.extend(other.released)
        self.group_events |= other.group_events
        if other.policy_version is not None:
            self.policy_version = other.policy_version

    def __bool__(self) -> bool:
        return bool(
            self.runs
            or self.groups
            or self.sessions
            or self.attempts
            or self.results
            or self.released
            or self.policy_version is not None
        )
