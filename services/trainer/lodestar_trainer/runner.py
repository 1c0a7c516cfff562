"""Runs a Trainer in its own thread and answers the service's questions from asyncio code.

The training loop is synchronous torch; it runs in a daemon thread so the asyncio gRPC server stays
responsive. `TrainerRunner` exposes status, step subscriptions (asyncio queues fed from the training
thread), SaveCheckpoint (below the checkpoint directory only; waits for the current step, then writes)
and Stop (finishes the current step, optionally checkpoints, and waits for the thread with a deadline).
Without a trainer (no --run/--model) the runner is idle: WAITING with the reason in `error`, and every
control call is refused.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from lodestar.errors import DeadlineExceededError, FailedPreconditionError, InvalidArgumentError
from lodestar.paths import confined
from lodestar_trainer.loop import Trainer
from lodestar_trainer.metrics import StepRecord
from lodestar_trainer.status import Phase, Status, StatusBoard, StopReason

IDLE_REASON = "no run configured: start the trainer with --run RUN_ID --model DIR"
_END = None


def checkpoint_target(path: Path, checkpoint_dir: Path) -> Path:
    """Where SaveCheckpoint(path) may write: a directory below the checkpoint directory (a relative path is
    taken under it; symlinks are followed before the check), never the checkpoint directory itself (a save
    replaces its target). PermissionDeniedError outside it, InvalidArgumentError for the directory itself."""
    target = confined(
        path, [checkpoint_dir], "SaveCheckpoint path", setting="--checkpoints.dir", relative_to=checkpoint_dir
    )
    if target == Path(os.path.realpath(checkpoint_dir)):
        raise InvalidArgumentError("SaveCheckpoint path must name a directory below the checkpoint directory")
    return target


class TrainerRunner:
    def __init__(self, trainer: Trainer | None, *, stop_timeout_s: float = 600.0) -> None:
        self.trainer = trainer
        self._board = trainer.board if trainer is not None else StatusBoard(Status(error=IDLE_REASON))
        self._stop_timeout_s = stop_timeout_s
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.trainer is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="trainer-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.trainer is not None
        self.trainer.run()

    def status(self) -> Status:
        return self._board.snapshot()

    def _require(self) -> Trainer:
        if self.trainer is None:
            raise FailedPreconditionError(IDLE_REASON)
        return self.trainer

    async def save_checkpoint(self, path: Path | None) -> tuple[Path, int]:
        """Checkpoint now, into `path` (None: the next step directory of the checkpoint directory)."""
        trainer = self._require()
        target = None if path is None else checkpoint_target(path, trainer.control.checkpoint_dir)
        return await asyncio.to_thread(trainer.save_now, target)

    async def stop(self, *, save_checkpoint: bool) -> Status:
        """Finish the current step (and checkpoint when asked), then stop; returns the final status."""
        if self.trainer is None:
            return self._board.update(phase=Phase.STOPPED, stop_reason=StopReason.STOP_REQUESTED)
        running = self._thread is not None and self._thread.is_alive()
        self.trainer.request_stop(save_checkpoint=save_checkpoint)
        if self._thread is None:
            if save_checkpoint:
                await asyncio.to_thread(self.trainer.save_now, None)
            return self._board.update(phase=Phase.STOPPED, stop_reason=StopReason.STOP_REQUESTED)
        await asyncio.to_thread(self._thread.join, self._stop_timeout_s)
        if self._thread.is_alive():
            raise DeadlineExceededError(f"the current step did not finish within {self._stop_timeout_s:.0f} s")
        if save_checkpoint and not running:
            await asyncio.to_thread(self.trainer.save_now, None)
        return self._board.snapshot()

    async def records(self) -> AsyncIterator[StepRecord]:
        """The latest step record (if any), then every new one, until the trainer stops or fails."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StepRecord | None] = asyncio.Queue()

        def on_step(record: StepRecord) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, record)

        self._board.add_listener(on_step)
        try:
            latest = self._board.snapshot().last_record
            sent = -1
            if latest is not None:
                sent = latest.step
                yield latest
            while True:
                if self._finished() and queue.empty():
                    return
                try:
                    record = await asyncio.wait_for(queue.get(), timeout=1.0)
                except TimeoutError:
                    continue
                if record is _END:
                    return
                if record.step > sent:
                    sent = record.step
                    yield record
        finally:
            self._board.remove_listener(on_step)

    def _finished(self) -> bool:
        return self.status().phase in (Phase.STOPPED, Phase.FAILED)

    async def close(self) -> None:
        """Stop at shutdown (no checkpoint unless configured) without failing the shutdown."""
        if self.trainer is not None and self._thread is not None and self._thread.is_alive():
            self.trainer.request_stop()
            await asyncio.to_thread(self._thread.join, self._stop_timeout_s)
