"""The trainer's control plane: what other threads ask of the training loop, and where its weights go.

- Requests from the servicer and runner (any thread): Stop (`request_stop`), SaveCheckpoint (`save_now`:
  queued in rank 0's inbox and served by the training thread between steps, on every rank under torchrun;
  written at once when the loop is not running), and their bookkeeping when the loop ends.
- Checkpoints (`save`): one process gathers the full state, torchrun ranks write their shards (sharded.py);
  with LoRA the adapter alone (lora.py), and each version pushed is the adapter alone too.
- Publishing: each new version to inference (publish.py), synchronously or overlapping the next step
  (pushing.py), rollout told the version inference serves; before the first step and while the trainer
  waits for groups, the trainer's weights pushed when the replicas serve other versions (`sync_inference`:
  its version to replicas behind it, restarted ones, or past its own run's versions served beyond its
  checkpoint: weights/versions.py).

Status itself is the StatusBoard (status.py), which the loop and this plane update and GetStatus reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import TimeoutError as FutureTimeoutError
from pathlib import Path
from typing import Any, Protocol

import torch

from lodestar.errors import DeadlineExceededError, FailedPreconditionError, LodestarError, UnavailableError
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_trainer.checkpoint import TrainState, save_checkpoint, step_dir
from lodestar_trainer.inbox import Idle, Inbox, SaveRequest
from lodestar_trainer.lora import ADAPTER_CONFIG, adapter_config_text, adapter_state, push_state
from lodestar_trainer.metrics import mean_std
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.parallel.sharded import save_sharded
from lodestar_trainer.planner import Plan
from lodestar_trainer.settings import LoraSettings
from lodestar_trainer.status import StatusBoard, StopReason
from lodestar_trainer.weights.publish import PublishResult, ServedVersion
from lodestar_trainer.weights.pushing import BackgroundPush, push, shares_memory
from lodestar_trainer.weights.versions import start_version

_log = get_logger("trainer")

STOPPED_UNDER_TORCHRUN = "the trainer has stopped: under torchrun a checkpoint needs every rank, and they have exited"


class GroupSource(Protocol):
    def groups(self, start_after: int = 0) -> Iterator[rollout_pb2.Group]: ...
    def cancel(self) -> None: ...
    def report_policy_version(self, version: int) -> None: ...


class Publisher(Protocol):
    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult: ...
    def payload_dtype(self) -> torch.dtype | None: ...
    def served_versions(self) -> dict[str, ServedVersion]: ...
    @property
    def writer(self) -> str:
        """The identity every push carries (the run id: wiring.py `publisher_of`)."""
        ...


class ControlPlane:
    """See the module docstring. `state` reads the loop's current TrainState (under `step_lock` when it must
    not change meanwhile)."""

    def __init__(
        self,
        *,
        parallel: Parallel,
        board: StatusBoard,
        model: Any,
        optimizer: torch.optim.Optimizer,
        state: Callable[[], TrainState],
        checkpoint_dir: Path,
        model_files: list[Path],
        async_push: bool = False,
        lora: LoraSettings | None = None,
        base_model: str = "",
    ) -> None:
        self.parallel, self.board, self.model, self.optimizer = parallel, board, model, optimizer
        self.state, self.checkpoint_dir, self.model_files = state, checkpoint_dir, model_files
        self.async_push = async_push
        self.lora, self.base_model = lora, base_model
        """LoRA (one process): checkpoints hold the adapter of `base_model`, and each version pushed is it."""
        self.source: GroupSource | None = None
        self.publisher: Publisher | None = None
        self.step_lock = threading.Lock()
        """Held by the training thread while a step runs; a checkpoint is written under it."""
        self.saved_step = -1
        self._stop = threading.Event()
        self._save_on_stop = False
        self._inbox: Inbox | None = None
        """Rank 0's groups and SaveCheckpoint requests while the loop runs (inbox.py); None when it does not."""
        self._inbox_lock = threading.Lock()
        self._asked: SaveRequest | None = None
        self._pusher: BackgroundPush | None = None

    # -- requests (any thread) -----------------------------------------------------------------------------

    def request_stop(self, *, save_checkpoint: bool = False) -> None:
        """Finish the current step, then stop (saving a checkpoint first when asked)."""
        self._save_on_stop = self._save_on_stop or save_checkpoint
        self._stop.set()
        if self.source is not None:
            self.source.cancel()
        with self._inbox_lock:
            if self._inbox is not None:
                self._inbox.wake()

    def stopping(self) -> bool:
        return self._stop.is_set()

    def save_now(self, path: Path | None, *, timeout_s: float = 3600.0) -> tuple[Path, int]:
        """SaveCheckpoint from another thread: the training thread writes it after the current step (at once
        while it waits for groups), on every rank under torchrun; (directory, step). Once the loop has ended,
        one process writes it here; under torchrun the other ranks are gone (FailedPreconditionError)."""
        request = SaveRequest(path)
        with self._inbox_lock:
            looping = self._inbox is not None
            if self._inbox is not None:
                self._inbox.put(request)
        if not looping:
            if self.parallel.distributed:
                raise FailedPreconditionError(STOPPED_UNDER_TORCHRUN)
            with self.step_lock:
                return self.save(path), self.state().step
        try:
            return request.done.result(timeout_s)
        except FutureTimeoutError:
            request.done.cancel()
            raise DeadlineExceededError(f"the trainer did not reach a step boundary within {timeout_s:.0f} s") from None

    # -- the loop's side (the training thread) -------------------------------------------------------------

    @property
    def inbox(self) -> Inbox | None:
        return self._inbox

    def open_inbox(self) -> Inbox:
        """Rank 0 starts reading the run's groups after those the state has read."""
        with self._inbox_lock:
            self._inbox = Inbox(self.source.groups(self.state().groups_read) if self.source else None)
            return self._inbox

    def between_steps(self, request: SaveRequest | Idle) -> Plan:
        """The plan of a SaveCheckpoint request (its directory resolved here, on rank 0), or a keepalive."""
        if not isinstance(request, SaveRequest) or not request.done.set_running_or_notify_cancel():
            return Plan(keepalive=True)  # idle, or a request whose caller gave up
        self._asked = request
        return Plan(checkpoint=request.path or step_dir(self.checkpoint_dir, self.state().step))

    def serve_requested(self, target: Path) -> None:
        """Serve SaveCheckpoint between steps on every rank; its error goes to the caller (rank 0), and the loop
        goes on (a failed save raises on every rank alike: sharded.py)."""
        request, self._asked = self._asked, None
        try:
            with self.step_lock:
                saved = self.save(target), self.state().step
        except Exception as error:
            _log.warning("requested checkpoint not written", path=str(target), error=str(error))
            if request is not None:
                request.done.set_exception(error)
        else:
            if request is not None:
                request.done.set_result(saved)

    def stop_plan(self, plan: Plan) -> Plan:
        """Stop before `plan` had its groups (the run ended, Stop, no signal): publish what the groups it read
        scored (the last policies' reward, which no step's metrics show)."""
        assert plan.stop is not None
        reward_mean = mean_std(plan.rewards())[0]
        _log.info(
            "trainer stopping",
            reason=plan.stop.value,
            step=self.state().step,
            untrained_groups=plan.read,
            untrained_reward_mean=round(reward_mean, 4),
        )
        self.board.update(untrained_groups=plan.read, untrained_reward_mean=reward_mean)
        return Plan(stop=plan.stop, save=self._save_on_stop)

    def steps_done_plan(self) -> Plan:
        """The last steps are done; a Stop asked meanwhile still gets its checkpoint (alone: no rank must agree)."""
        return Plan(stop=StopReason.STEPS_DONE, save=self._save_on_stop and not self.parallel.distributed)

    def close(self) -> None:
        """The loop ends: requests not served are served alone (one process) or refused (torchrun); the
        background push stops."""
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, None
        if self._asked is not None:  # the loop failed between taking a request and serving it
            self._asked.done.set_exception(FailedPreconditionError("the trainer failed before the checkpoint"))
        for request in inbox.pending() if inbox is not None else []:
            if not request.done.set_running_or_notify_cancel():
                continue
            try:
                if self.parallel.distributed:
                    raise FailedPreconditionError(STOPPED_UNDER_TORCHRUN)
                with self.step_lock:
                    request.done.set_result((self.save(request.path), self.state().step))
            except Exception as error:
                request.done.set_exception(error)
        if self._pusher is not None:
            self._pusher.close()

    # -- checkpoints -------------------------------------------------------------------------------------

    def save(self, path: Path | None) -> Path:
        """Write a checkpoint of the current state (between steps); returns its directory."""
        state = self.state()
        target = path or step_dir(self.checkpoint_dir, state.step)
        if self.parallel.distributed:
            save_sharded(
                target,
                parallel=self.parallel,
                model=self.model,
                optimizer=self.optimizer,
                state=state,
                model_files=self.model_files,
            )
            return self._saved(target, state.step)
        weights = adapter_state(self.model) if self.lora else self.parallel.full_state(self.model)
        optimizer = self.parallel.optimizer_state(self.model, self.optimizer)
        extra = {ADAPTER_CONFIG: adapter_config_text(self.lora, self.base_model)} if self.lora else None
        if self.parallel.is_main:
            save_checkpoint(
                target,
                weights=weights,
                optimizer=optimizer,
                state=state,
                model_files=self.model_files,
                extra_files=extra,
            )
        return self._saved(target, state.step)

    def _saved(self, target: Path, step: int) -> Path:
        if self.parallel.is_main:
            _log.info("checkpoint written", path=str(target), step=step)
            self.board.update(last_checkpoint=str(target))
        self.saved_step = step
        return target

    # -- publishing ----------------------------------------------------------------------------------------

    def sync_inference(self, *, waiting: bool = False) -> int:
        """Push the trainer's weights when the replicas serve other versions, as the version `start_version`
        names (weights/versions.py: the state's own version to replicas behind it, or past the newest version
        when replicas serve this run's versions past it); returns the policy version the trainer goes on from
        (the state's, or the one pushed). Before the first step, and (`waiting`) whenever the trainer has waited
        for groups for a while: replicas restarted since the last push serve an older version, and no push
        comes while the trainer waits; when all of them restarted, rollout drops every group they sample as
        stale and the trainer would wait forever (the chaos hour, docs/chaos.md). While waiting, replicas that
        cannot be asked or pushed to are left for the next wait."""
        version = self.state().policy_version
        target = None
        if self.parallel.is_main and self.publisher is not None:
            if waiting:
                self.finish_pushes()  # a version on its way is not a replica behind
            target = start_version(version, self._served(version, waiting=waiting), self.publisher.writer)
        target = self.parallel.broadcast(target)
        if target is None:
            return version
        weights = self._pushed()
        if self.parallel.is_main and self.publisher is not None:
            try:
                seconds = round(self.publisher.publish(weights, target).seconds, 3)
            except UnavailableError as error:
                if not waiting:
                    raise
                _log.warning("replicas behind not caught up", policy_version=target, error=error.message)
                return version
            if target == version:
                event = "replicas behind caught up" if waiting else "resumed weights pushed"
                _log.info(event, policy_version=version, seconds=seconds)
            else:
                _log.warning(
                    "the run's versions were served past this state: its weights pushed past them",
                    policy_version=target,
                    state_version=version,
                    newest_served=target - 1,
                    seconds=seconds,
                )
                self._report_version(target)
        return int(target)

    def _served(self, version: int, *, waiting: bool) -> dict[str, ServedVersion]:
        """What the replicas serve; none when a fresh trainer (`version` 0) or a waiting one cannot ask (its next
        push, or its next wait, will tell), an error when a resumed one cannot."""
        assert self.publisher is not None
        try:
            return self.publisher.served_versions()
        except LodestarError:
            if version and not waiting:
                raise
            return {}

    def publish(self) -> tuple[int, float]:
        """Push the new weights to inference and tell rollout (rank 0; the state gather is collective); with
        `async_push` the push goes on in the background. Returns (payload bytes, seconds spent waiting for
        inference to serve a version: the whole push when synchronous, the previous one's rest when not)."""
        if not self.parallel.distributed and self.publisher is None and self.source is None:
            return 0, 0.0
        weights = self._pushed()
        if not self.parallel.is_main:
            return 0, 0.0
        version = self.state().policy_version
        if self.async_push and self.publisher is not None:
            if self._pusher is None:
                self._pusher = BackgroundPush(self.publisher, self._report_version)
            return self._pusher.submit(weights, version, copy=shares_memory(weights, self.model))
        result = push(self.publisher, weights, version) if self.publisher else None
        self._report_version(version)
        return (result.payload_bytes, result.seconds) if result else (0, 0.0)

    def _pushed(self) -> dict[str, torch.Tensor]:
        """A policy version's payload: the full weights (gathered: collective), or with LoRA the adapter alone
        (lora.py `push_state`: a replica adds it to the base weights it loaded once)."""
        return push_state(self.model) if self.lora else self.parallel.full_state(self.model)

    def finish_pushes(self) -> None:
        """Inference serves the last version (or the background push's error fails the run)."""
        if self._pusher is not None:
            self._pusher.wait()

    def _report_version(self, version: int) -> None:
        """Tell rollout that inference serves `version` (best effort: the next step reports a newer one)."""
        if self.source is None:
            return
        try:
            self.source.report_policy_version(version)
        except LodestarError as error:
            _log.warning("policy version not reported", policy_version=version, error=error.message)
