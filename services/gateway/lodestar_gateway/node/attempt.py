"""One session attempt on a node: where it is in its lifecycle, what each stage took, and its result.

Pure bookkeeping (no I/O): the stages fill it in, the lifecycle reads it for progress reports, and
`result()` builds the SessionResult sent to rollout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from google.protobuf import duration_pb2, struct_pb2

from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_gateway.node.harnesses import HarnessResult
from lodestar_gateway.node.runtimes.base import SessionRuntime

TAIL_CHARS = 8000
STAGE_NAMES: dict[rollout_pb2.SessionStage.ValueType, str] = {
    rollout_pb2.SESSION_STAGE_INIT: "INIT",
    rollout_pb2.SESSION_STAGE_READY: "READY",
    rollout_pb2.SESSION_STAGE_RUN: "RUN",
    rollout_pb2.SESSION_STAGE_POST: "POST",
}
AttemptKey = tuple[str, int]
Stage: TypeAlias = rollout_pb2.SessionStage.ValueType
OutcomeCode: TypeAlias = rollout_pb2.SessionOutcome.ValueType


def duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(max(seconds, 0.0) * 1e9))
    return value


def completion_text(message: common_pb2.ChatMessage) -> str:
    return "".join(part.text.text for part in message.content if part.HasField("text"))


def final_answer(calls: list[common_pb2.CallRecord]) -> str:
    """The text of the session's last assistant completion (by sequence; reasoning excluded)."""
    if not calls:
        return ""
    last = max(calls, key=lambda call: call.sequence)
    return completion_text(last.completion).strip()


@dataclass
class Attempt:
    """A session attempt held by this node."""

    assignment: rollout_pb2.SessionAssignment
    stage: Stage = rollout_pb2.SESSION_STAGE_INIT
    started: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=dict)
    """Time spent per stage ("init", "ready", "run", "post")."""
    runtime: SessionRuntime | None = None
    gateway_session_id: str = ""
    gateway_session_key: str = ""
    harness: HarnessResult | None = None
    calls: list[common_pb2.CallRecord] = field(default_factory=list)
    stop_reason: str | None = None
    """Why the node stopped this attempt early (rollout cancellation, node shutdown), if it did."""
    stop_outcome: OutcomeCode = rollout_pb2.SESSION_OUTCOME_CANCELLED
    finishing: bool = False
    """Its outcome is decided: it is being released and reported, and can no longer be cancelled."""
    _stage_started: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> AttemptKey:
        return (self.assignment.session_id, self.assignment.attempt)

    @property
    def name(self) -> str:
        """A file-system-safe name for this attempt."""
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.assignment.session_id)
        return f"{safe}-a{self.assignment.attempt}"

    def enter(self, stage: Stage) -> None:
        """Close the current stage's clock and start `stage`'s."""
        self._close_stage()
        self.stage = stage

    def _close_stage(self) -> None:
        now = time.monotonic()
        name = STAGE_NAMES[self.stage].lower()
        self.seconds[name] = self.seconds.get(name, 0.0) + (now - self._stage_started)
        self._stage_started = now

    def active_seconds(self) -> float:
        """Seconds spent so far outside the READY buffer (what the session timeout bounds)."""
        current = time.monotonic() - self._stage_started
        spent = sum(value for name, value in self.seconds.items() if name != "ready")
        return spent + (0.0 if self.stage == rollout_pb2.SESSION_STAGE_READY else current)

    def progress(self) -> rollout_pb2.SessionProgress:
        return rollout_pb2.SessionProgress(
            session_id=self.assignment.session_id, attempt=self.assignment.attempt, stage=self.stage
        )

    def result(
        self,
        node_id: str,
        outcome: OutcomeCode,
        *,
        reward: float = 0.0,
        error: str = "",
        details: dict[str, Any] | None = None,
    ) -> rollout_pb2.SessionResult:
        self._close_stage()
        harness = self.harness
        verifier_details = struct_pb2.Struct()
        if details:
            verifier_details.update(details)
        return rollout_pb2.SessionResult(
            session_id=self.assignment.session_id,
            attempt=self.assignment.attempt,
            node_id=node_id,
            outcome=outcome,
            reward=reward,
            calls=sorted(self.calls, key=lambda call: call.sequence),
            exit_code=harness.returncode if harness is not None and harness.returncode >= 0 else -1,
            stdout_tail=harness.stdout[-TAIL_CHARS:] if harness else "",
            stderr_tail=harness.stderr[-TAIL_CHARS:] if harness else "",
            verifier_details=verifier_details,
            agent_duration=duration(self.seconds.get("run", 0.0)),
            session_duration=duration(time.monotonic() - self.started),
            error=error,
            init_duration=duration(self.seconds.get("init", 0.0)),
            ready_duration=duration(self.seconds.get("ready", 0.0)),
            post_duration=duration(self.seconds.get("post", 0.0)),
            final_answer=final_answer(self.calls),
            harness=self.assignment.harness.kind,
        )
