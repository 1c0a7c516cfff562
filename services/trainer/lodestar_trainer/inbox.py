"""Where the training thread of rank 0 waits between steps: for rollout's next group, or for a request that
another thread made (SaveCheckpoint), whichever comes first.

Reading a group blocks for as long as sessions take (minutes), and a checkpoint must be written by the
training thread itself: under torchrun every rank takes part (each writes its shard) and the other ranks
wait for rank 0's next plan in a collective, and on a GPU the training thread is the one whose current
CUDA device is set. So a helper thread reads the group iterator, one group at a time and only when the
loop asks for one (no group waits in a buffer while a step runs: it would go stale there, unseen by
rollout's staleness check), and the loop waits on both. A wait also ends after a timeout (the loop then
tells the other ranks it is alive, before their collective deadline) or when `wake()` is called (Stop).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from lodestar.v1 import rollout_pb2


class Idle(Enum):
    IDLE = "idle"
    """Neither a group nor a request came before the timeout (or `wake()` was called)."""


IDLE = Idle.IDLE


@dataclass
class SaveRequest:
    """SaveCheckpoint: `path` (None: the next step directory); `done` gets (directory, step) or the error."""

    path: Path | None
    done: Future[tuple[Path, int]] = field(default_factory=Future)


_END = object()


class Inbox:
    """See the module docstring. `next` is called by the training thread only; `put` and `wake` by any."""

    def __init__(self, groups: Iterator[rollout_pb2.Group] | None) -> None:
        self._groups = groups
        self._cond = threading.Condition()
        self._requests: deque[SaveRequest] = deque()
        self._arrived: deque[object] = deque()
        self._asked = False
        self._reading = False
        self._woken = False
        self._ended = groups is None
        self._reader: threading.Thread | None = None

    def put(self, request: SaveRequest) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def wake(self) -> None:
        """End the current (or the next) wait now with IDLE."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def pending(self) -> list[SaveRequest]:
        """Take the requests not served yet (the loop is ending)."""
        with self._cond:
            taken = list(self._requests)
            self._requests.clear()
            return taken

    def next(self, timeout_s: float) -> SaveRequest | rollout_pb2.Group | Idle | None:
        """A request if one waits; else the next group (None: the groups ended); IDLE after `timeout_s`. An
        error of the group iterator is raised here."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._requests:
                    return self._requests.popleft()
                if self._arrived:
                    item = self._arrived.popleft()
                    if isinstance(item, BaseException):
                        raise item
                    return None if item is _END else item  # type: ignore[return-value]
                if self._ended:
                    return None
                if self._woken:
                    self._woken = False
                    return IDLE
                if not self._reading:
                    self._ask()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return IDLE
                self._cond.wait(remaining)

    def _ask(self) -> None:
        """Let the reader read one group (called with the lock held)."""
        self._reading = self._asked = True
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name="trainer-groups", daemon=True)
            self._reader.start()
        self._cond.notify_all()

    def _read(self) -> None:
        assert self._groups is not None
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._asked)
                self._asked = False
            item: object
            try:
                item = next(self._groups, _END)
            except BaseException as error:  # handed to the training thread
                item = error
            with self._cond:
                self._arrived.append(item)
                self._reading = False
                if item is _END or isinstance(item, BaseException):
                    self._ended = True
                self._cond.notify_all()
                if self._ended:
                    return
