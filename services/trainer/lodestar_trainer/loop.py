"""The GRPO training loop, top to bottom: pull groups -> build -> pack -> forward/backward per micro-batch
-> optimizer step -> push weights -> ReportPolicyVersion -> checkpoint every N steps -> metrics.

One step:
1. Read groups from rollout until `batch.groups_per_step` groups with signal are in hand (planner.py;
   groups.py turns each into Samples with group-relative advantages). A bad group (another run, no scored
   session, a call whose ids and logprobs differ in length) skips the step: its groups are not trained on, the reason
   goes to the log, to GetStatus.error and to skipped_steps.
   While it waits, every 15 s the replicas are asked which version they serve: restarted ones get the
   weights (control.py `sync_inference`).
2. Build training sequences per group (builders/: per_request, prefix_merging or tree) and pack them into
   micro-batches of at most `batch.micro_batch_tokens` tokens (pack.py); a longer sequence is split into parts
   that recompute their context, with the same loss and gradient (split.py).
3. For each micro-batch (step/optimizer_step.py): the policy's logprob of every sampled token (forward.py),
   the policy loss under one step-level normalizer (loss.py), backward. Gradients accumulate to exactly the
   step gradient.
4. Clip the gradient norm, optimizer step (AdamW), policy version + 1.
5. Push the weights to inference (control.py, publish.py; inference swaps atomically), report the version to
   rollout.
6. Every `checkpoints.every` steps a checkpoint (checkpoint.py); metrics to JSONL + TensorBoard (metrics.py).

The parts: the planner (planner.py: what a step trains on), the step (step/optimizer_step.py: the update and
its statistics), the control plane (control.py: Stop, SaveCheckpoint, checkpoints, publishing). This module
composes them; `Trainer.run` is the loop.

Deviations from textbook GRPO (Shao et al. 2024), each on purpose:
- Asynchronous and off-policy by design: groups were sampled by the inference engine under some earlier
  policy version (staleness is bounded by rollout and logged here). The ratio's "old" policy is the
  behaviour policy's captured inference logprobs (`behaviour_correction="ppo_clip"`), or, with
  `"tis"`, the trainer's own logprobs before the step with a truncated importance weight
  min(pi_trainer/pi_inference, cap) against the captured ones (loss.py).
- One optimizer step per batch of groups (no PPO epochs over the same batch), so "old" = the current
  policy before the step needs no second forward: it is the detached logprob of the same pass.
- Groups whose rewards are all equal are dropped before any compute (no gradient; counted), and the step
  keeps reading groups until it has `groups_per_step` with signal (dynamic sampling, as in DAPO); their
  rewards still count in the step's reward metrics.
- Clip-higher (asymmetric clip bounds), token-level aggregation by default, KL to the initial model off by
  default (k3 estimator when on): see loss.py.
- Sessions that failed for infrastructure reasons never reach the loss (groups.py); a scored session
  without calls still counts in its group's baseline.
- Sequences are token-faithful merges of a session's calls (prefix merging / tree), not one sequence per
  completion: the loss and gradients are the same as per-call training (tests/trainer/test_equivalence).
"""

from __future__ import annotations

import resource
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
import torch

from lodestar.errors import FailedPreconditionError, LodestarError
from lodestar.logging import get_logger
from lodestar_trainer.checkpoint import TrainState
from lodestar_trainer.control import ControlPlane, GroupSource, Publisher
from lodestar_trainer.data.groups import BadGroupError
from lodestar_trainer.metrics import MetricsWriter, StepRecord
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.planner import Plan, Planner
from lodestar_trainer.settings import TrainerSettings
from lodestar_trainer.status import Phase, StatusBoard
from lodestar_trainer.step.mismatch import MismatchTally
from lodestar_trainer.step.optimizer_step import Gradient, OptimizerStep
from lodestar_trainer.step.precision import ComputeCopy

_log = get_logger("trainer")

__all__ = ["GroupSource", "Publisher", "Trainer"]


class Trainer:
    """Owns the model, the optimizer and the loop state; `run()` is the body of the training thread."""

    def __init__(
        self,
        settings: TrainerSettings,
        *,
        model: Any,
        optimizer: torch.optim.Optimizer,
        state: TrainState,
        board: StatusBoard,
        vocab_size: int = 0,
        parallel: Parallel | None = None,
        source: GroupSource | None = None,
        publisher: Publisher | None = None,
        metrics: MetricsWriter | None = None,
        reference: Any = None,
        compute: ComputeCopy | None = None,
        model_files: list[Path] | None = None,
    ) -> None:
        if settings.run is None:
            raise FailedPreconditionError("the trainer needs --run RUN_ID")
        self.settings, self.run_id = settings, settings.run
        self.model, self.optimizer, self.state, self.board = model, optimizer, state, board
        self.parallel = parallel or Parallel()
        self.metrics, self.reference, self.compute = metrics, reference, compute
        self.planner = Planner(settings.batch, run_id=settings.run, vocab_size=vocab_size)
        self.step = OptimizerStep(
            settings.loss,
            settings.optimizer,
            settings.metrics,
            settings.compute.attention_backend(),
            model,
            optimizer,
            self.parallel,
            compute=compute,
            reference=reference,
        )
        self.control = ControlPlane(
            parallel=self.parallel,
            board=board,
            model=model,
            optimizer=optimizer,
            state=lambda: self.state,
            checkpoint_dir=settings.checkpoint_dir(),
            model_files=model_files or [],
            async_push=settings.weights.async_push,
            lora=settings.lora if settings.lora.enabled else None,
            base_model=str(settings.model or ""),
        )
        self.control.source, self.control.publisher = source, publisher

    @property
    def source(self) -> GroupSource | None:
        return self.control.source

    @source.setter
    def source(self, value: GroupSource | None) -> None:
        self.control.source = value

    @property
    def publisher(self) -> Publisher | None:
        return self.control.publisher

    @publisher.setter
    def publisher(self, value: Publisher | None) -> None:
        self.control.publisher = value

    # -- the loop --------------------------------------------------------------------------------------

    def run(self) -> None:
        """Train until `steps` are done, Stop, or the run's groups end; FAILED with the reason on an error."""
        with structlog.contextvars.bound_contextvars(run_id=self.run_id, rank=self.parallel.rank):
            self._run()

    def _run(self) -> None:
        try:
            device = self._device()
            if device.type == "cuda":  # the current CUDA device is per thread: set it in the one that trains
                torch.cuda.set_device(device)
            self._sync_inference(waiting=False)
            if self.parallel.is_main:
                self.control.open_inbox()
            last = self.state.step + self.settings.steps if self.settings.steps else None
            while last is None or self.state.step < last:
                self.board.update(phase=Phase.WAITING)
                plan = self.parallel.broadcast(self._next_plan() if self.parallel.is_main else None)
                assert plan is not None
                if plan.keepalive:  # a quiet wait for groups: replicas restarted meanwhile get the weights
                    self._sync_inference(waiting=True)
                    continue
                if plan.checkpoint is not None:
                    self.control.serve_requested(plan.checkpoint)
                    continue
                if plan.stop is not None:
                    break
                if plan.error:
                    self._skip(plan)
                    continue
                self.board.update(phase=Phase.TRAINING)
                try:
                    with self.control.step_lock:
                        self.train_step(plan)
                except BadGroupError as error:  # raised before anything changed: the step is skipped
                    plan.error = error.message
                    self._skip(plan)
            else:
                plan = self.control.steps_done_plan()
            self.control.finish_pushes()
            if plan.save or (self.settings.checkpoints.every and 0 < self.state.step != self.control.saved_step):
                self.control.save(None)
            self.board.update(phase=Phase.STOPPED, stop_reason=plan.stop)
        except Exception as error:
            reason = error.message if isinstance(error, LodestarError) else f"{type(error).__name__}: {error}"
            _log.exception("trainer failed", error=reason, step=self.state.step)
            self.board.update(phase=Phase.FAILED, error=reason)
        finally:
            self.control.close()
            if self.metrics is not None:
                self.metrics.close()

    def _sync_inference(self, *, waiting: bool) -> None:
        """Replicas that serve other versions get the weights (control.py `sync_inference`); a version pushed past
        the run's own served ones is where the trainer goes on from."""
        version = self.control.sync_inference(waiting=waiting)
        if version != self.state.policy_version:
            self._advance(steps=0, version=version - self.state.policy_version, read=0)
            self.board.update(policy_version=version)

    def _next_plan(self) -> Plan:
        """Rank 0: what every rank does next: the planner's groups, a stop, or a request between steps."""
        assert self.control.inbox is not None
        taken = self.planner.next_plan(
            self.control.inbox, policy_version=self.state.policy_version, stopping=self.control.stopping
        )
        if not isinstance(taken, Plan):
            return self.control.between_steps(taken)
        return self.control.stop_plan(taken) if taken.stop is not None else taken

    def train_step(self, plan: Plan) -> StepRecord:
        """One optimizer step on the plan's groups (module docstring, steps 2-6)."""
        started = self._clock()
        batches = self.planner.batches(plan)
        built = self._clock()

        harness_of = {sample.sample_index: sample.harness for group in plan.groups for sample in group.samples}
        tally = MismatchTally(harness_of, version=self.state.policy_version)
        gradient = self.step.accumulate(batches.micro_batches, tally)
        backward_done = self._clock()

        self.step.apply()
        version_before = self.state.policy_version
        self._advance(steps=1, version=1, read=plan.read)
        optimized = self._clock()

        push = self.control.publish()
        pushed = self._clock()

        seconds = {
            "time_build": built - started,
            "time_forward_backward": backward_done - built,
            "time_optimizer": optimized - backward_done,
            "time_push": pushed - optimized,
        }
        self.planner.count_consumed(plan)
        values = self.step.statistics(
            groups=plan.groups,
            no_signal_rewards=plan.no_signal_rewards,
            stats=batches.stats,
            split=batches.split,
            micro_batches=len(batches.micro_batches),
            gradient=gradient,
            seconds=seconds,
            version_before=version_before,
            counters=self.planner.counters,
            push=push,
        )
        return self._record(values | _peak_memory(), gradient)

    def _record(self, values: dict[str, float], gradient: Gradient) -> StepRecord:
        """The step's record to the metrics, the log and the status board; a checkpoint when one is due."""
        record = StepRecord(self.state.step, self.state.policy_version, values)
        warning = self.step.mismatch_warning(gradient.mismatch, self.state.step)
        if warning is not None:
            self.board.update(warning=warning)
        if self.parallel.is_main and self.metrics is not None:
            self.metrics.write(record)
        _log.info("step", step=record.step, policy_version=record.policy_version, **_headline(values))
        self.board.publish_step(record, step=self.state.step, policy_version=self.state.policy_version)
        every = self.settings.checkpoints.every
        if every and self.state.step > 0 and self.state.step % every == 0:
            self.control.save(None)
        return record

    def _skip(self, plan: Plan) -> None:
        self.planner.count_consumed(plan)
        skipped = self.board.snapshot().skipped_steps + 1
        self._advance(steps=0, version=0, read=plan.read, skipped=1)
        _log.warning("step skipped", reason=plan.error, skipped_steps=skipped, step=self.state.step)
        self.board.update(error=plan.error, skipped_steps=skipped)

    def _advance(self, *, steps: int, version: int, read: int, skipped: int = 0) -> None:
        s = self.state
        self.state = replace(
            s,
            step=s.step + steps,
            policy_version=s.policy_version + version,
            groups_read=s.groups_read + read,
            skipped_steps=s.skipped_steps + skipped,
        )

    def _device(self) -> torch.device:
        """The device the model trains on (its first parameter's; a sharded one's local device)."""
        parameter = next(self.model.parameters(), None)
        device = getattr(parameter, "device", None) if parameter is not None else None
        return device if isinstance(device, torch.device) else torch.device("cpu")

    def _clock(self) -> float:
        """perf_counter after the GPU's queued work (CUDA runs asynchronously: an unsynchronized timestamp
        would charge a step's kernels to whatever phase happens to wait for them)."""
        if self._device().type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    # -- control (any thread) ----------------------------------------------------------------------------

    def request_stop(self, *, save_checkpoint: bool = False) -> None:
        """Finish the current step, then stop (saving a checkpoint first when asked)."""
        self.control.request_stop(save_checkpoint=save_checkpoint)

    def save(self, path: Path | None) -> Path:
        """Write a checkpoint of the current state (between steps); returns its directory."""
        return self.control.save(path)

    def save_now(self, path: Path | None, *, timeout_s: float = 3600.0) -> tuple[Path, int]:
        """SaveCheckpoint from another thread (control.py)."""
        return self.control.save_now(path, timeout_s=timeout_s)


def _headline(values: dict[str, float]) -> dict[str, float]:
    keys = ("loss", "reward_mean", "merge_ratio", "time_step", "clip_fraction", "logprob_diff_max", "policy_drift_max")
    return {key: round(values[key], 5) for key in keys if key in values}


def _peak_memory() -> dict[str, float]:
    """`memory_peak_mb` and, where a GPU is in use, `cuda_memory_peak_mb` (lodestar_trainer/metrics.py)."""
    values = {"memory_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB on Linux
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        values["cuda_memory_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return values
