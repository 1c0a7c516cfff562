"""What the trainer is doing, shared between the training thread and the gRPC servicer (thread-safe).

The loop writes (`update`, `publish_step`); the servicer reads `snapshot()` and subscribes to step
records with `add_listener` (a listener is called in the training thread and must not block).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lodestar_trainer.metrics import StepRecord


class Phase(StrEnum):
    WAITING = "waiting"
    TRAINING = "training"
    STOPPED = "stopped"
    FAILED = "failed"


class StopReason(StrEnum):
    """Why a STOPPED trainer stopped (trainer.proto's StopReason)."""

    NONE = ""
    STEPS_DONE = "steps_done"
    STOP_REQUESTED = "stop_requested"
    RUN_ENDED = "run_ended"
    """The run's group stream ended."""
    NO_SIGNAL = "no_signal"
    """`stop_after_no_signal_groups` groups in a row had no reward signal."""


@dataclass(frozen=True)
class Status:
    phase: Phase = Phase.WAITING
    step: int = 0
    policy_version: int = 0
    run_id: str = ""
    last_record: StepRecord | None = None
    last_checkpoint: str = ""
    error: str = ""
    """Why the trainer FAILED, or the last skipped step's reason."""
    skipped_steps: int = 0
    untrained_groups: int = 0
    """Groups read after the last step and not trained on (the run ended or Stop came mid-step)."""
    untrained_reward_mean: float = 0.0
    stop_reason: StopReason = StopReason.NONE
    warning: str = ""
    """The last step whose trainer-vs-inference mismatch passed the warning threshold
    (lodestar_trainer/step/mismatch.py)."""


Listener = Callable[[StepRecord], None]


class StatusBoard:
    """The current Status plus step listeners."""

    def __init__(self, initial: Status) -> None:
        self._lock = threading.Lock()
        self._status = initial
        self._listeners: list[Listener] = []

    def snapshot(self) -> Status:
        with self._lock:
            return self._status

    def update(self, **changes: Any) -> Status:
        with self._lock:
            self._status = dataclasses.replace(self._status, **changes)
            return self._status

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def publish_step(self, record: StepRecord, **changes: Any) -> None:
        with self._lock:
            self._status = dataclasses.replace(self._status, last_record=record, **changes)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(record)
