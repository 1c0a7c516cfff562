"""A weight push that overlaps the next step (`async_push`): at most one policy version in flight.

With a synchronous push the trainer waits, every step, for inference to receive, validate and swap in the
new weights before it reads its next groups. `BackgroundPush` takes the step's state, serializes it on the
trainer's thread (a snapshot: the next optimizer step may change the parameters at once) and pushes the
bytes from a worker thread while the trainer trains its next step. Rollout hears the new version
(`on_served`) only once every replica serves it. Before a second version is sent the first must have
landed (`submit` waits for it): one version in flight, so sampling is at most one more version behind than
with a synchronous push, and the wait is what `push_wait_s` reports. An error of the push (a refusal, no
replica reachable) is raised in the trainer's thread by the next `submit` or `wait`: the trainer then fails
as it would have one step earlier.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import torch

from lodestar.logging import get_logger
from services.trainer.publish import PublishResult

_log = get_logger("trainer.push")


class PayloadPublisher(Protocol):
    def prepare(self, state: Mapping[str, torch.Tensor]) -> bytes: ...
    def publish_payload(self, payload: bytes, tensors: int, version: int, started: float) -> PublishResult: ...


class BackgroundPush:
    """Pushes versions from one worker thread, one at a time (see the module docstring)."""

    def __init__(self, publisher: PayloadPublisher, on_served: Callable[[int], None]) -> None:
        self._publisher = publisher
        self._on_served = on_served
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-push")
        self._pending: Future[PublishResult] | None = None
        self.last: PublishResult | None = None
        """The latest push that completed."""

    def submit(self, state: Mapping[str, torch.Tensor], version: int) -> tuple[int, float]:
        """Wait for the push in flight (raising its error), then start pushing `state` as `version`;
        returns (payload bytes, seconds waited for the previous push)."""
        waited = self.wait()
        started = time.perf_counter()
        payload = self._publisher.prepare(state)
        self._pending = self._pool.submit(self._push, payload, len(state), version, started)
        return len(payload), waited

    def wait(self) -> float:
        """Block until the push in flight is done (re-raising its error); the seconds waited."""
        pending, self._pending = self._pending, None
        if pending is None:
            return 0.0
        started = time.perf_counter()
        self.last = pending.result()
        return time.perf_counter() - started

    def close(self) -> None:
        """Finish the push in flight (errors logged: the trainer is stopping) and stop the worker."""
        try:
            self.wait()
        except Exception as error:
            _log.error("the last weight push failed", error=str(error))
        self._pool.shutdown(wait=True)

    def _push(self, payload: bytes, tensors: int, version: int, started: float) -> PublishResult:
        result = self._publisher.publish_payload(payload, tensors, version, started)
        self._on_served(version)
        _log.info("weights pushed", policy_version=version, seconds=round(result.seconds, 3),
                  payload_bytes=result.payload_bytes)  # fmt: skip
        return result
