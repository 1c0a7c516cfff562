"""The GRPO training loop, top to bottom: pull groups -> build -> pack -> forward/backward per micro-batch
-> optimizer step -> push weights -> ReportPolicyVersion -> checkpoint every N steps -> metrics.

One step:
1. Read groups from rollout until `groups_per_step` groups with signal are in hand (groups.py turns each
   into Samples with group-relative advantages). A bad group (another run, no scored session, a call
   whose ids and logprobs differ in length) skips the step: its groups are not trained on, the reason
   goes to the log, to GetStatus.error and to skipped_steps.
2. Build training sequences per group (builders/: per_request, prefix_merging or tree) and pack them into
   micro-batches of at most `micro_batch_tokens` tokens (pack.py); a longer sequence is split into parts
   that recompute their context, with the same loss and gradient (split.py).
3. For each micro-batch: the policy's logprob of every sampled token (forward.py), the policy loss under
   one step-level normalizer (loss.py), backward. Gradients accumulate to exactly the step gradient.
4. Clip the gradient norm, optimizer step (AdamW), policy version + 1.
5. Push the weights to inference (publish.py; inference swaps atomically), report the version to rollout.
6. Every `checkpoint_every` steps a checkpoint (checkpoint.py); metrics to JSONL + TensorBoard (metrics.py).

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

import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog
import torch

from lodestar.errors import DeadlineExceededError, FailedPreconditionError, LodestarError
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_trainer.builders import BuilderKind
from lodestar_trainer.checkpoint import TrainState, save_checkpoint, step_dir
from lodestar_trainer.data.batch import MicroBatch
from lodestar_trainer.data.groups import BadGroupError, GroupSamples, group_samples
from lodestar_trainer.data.pack import pack_step
from lodestar_trainer.data.sequences import build_step
from lodestar_trainer.inbox import IDLE, Idle, Inbox, SaveRequest
from lodestar_trainer.metrics import MetricsWriter, StepRecord, mean_std
from lodestar_trainer.parallel.distributed import COLLECTIVE_TIMEOUT, Parallel
from lodestar_trainer.parallel.sharded import save_sharded
from lodestar_trainer.status import Phase, StatusBoard, StopReason
from lodestar_trainer.step.advantages import AdvantageKind
from lodestar_trainer.step.forward import AttentionBackend, target_logprobs
from lodestar_trainer.step.loss import LossConfig, LossNormalizer, LossOutput, policy_loss
from lodestar_trainer.step.mismatch import MismatchTally, warning_text
from lodestar_trainer.step.precision import ComputeCopy
from lodestar_trainer.step.stepstats import loss_over_ranks, step_values
from lodestar_trainer.weights.publish import PublishResult
from lodestar_trainer.weights.pushing import BackgroundPush, shares_memory

_log = get_logger("trainer")

KEEPALIVE_S = COLLECTIVE_TIMEOUT.total_seconds() / 6
"""Longest wait of rank 0 for a group before it tells the other ranks (waiting in a collective) to wait on."""
STOPPED_UNDER_TORCHRUN = "the trainer has stopped: under torchrun a checkpoint needs every rank, and they have exited"

Correction = Literal["ppo_clip", "tis"]


class GroupSource(Protocol):
    def groups(self, start_after: int = 0) -> Iterator[rollout_pb2.Group]: ...
    def cancel(self) -> None: ...
    def report_policy_version(self, version: int) -> None: ...


class Publisher(Protocol):
    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> PublishResult: ...
    def payload_dtype(self) -> torch.dtype | None: ...
    def served_version(self) -> int: ...


@dataclass(frozen=True)
class LoopConfig:
    run_id: str
    builder: BuilderKind = BuilderKind.PREFIX_MERGING
    advantage: AdvantageKind = AdvantageKind.ZSCORE
    loss: LossConfig = field(default_factory=LossConfig)
    behaviour_correction: Correction = "ppo_clip"
    micro_batch_tokens: int = 8192
    groups_per_step: int = 1
    max_staleness: int = -1
    """Groups older than this many versions behind the trainer's are dropped when taken (-1: no check)."""
    steps: int = 0
    """Steps to run from the start (or resumed) step; 0: until stopped or the run ends."""
    max_grad_norm: float = 1.0
    checkpoint_every: int = 0
    checkpoint_dir: Path = Path(".lodestar/trainer/checkpoints")
    pass_threshold: float | None = None
    """Reward at or above which a sample passes (None: see `Trainer._pass_threshold`)."""
    vocab_size: int = 0
    """The model's vocabulary size: larger token ids in a group are bad input (0: unchecked)."""
    stop_after_no_signal_groups: int = 0
    """Stop when this many groups in a row had no reward signal (0: never; see `Trainer._next_plan`)."""
    mismatch_warn_nats: float = 0.1
    """Warn (log, GetStatus.warning) when a harness's mean |trainer - inference| logprob in a step is above
    this (0: never); see services/trainer/lodestar_trainer/step/mismatch.py."""
    async_push: bool = False
    """Push each version from a worker thread while the next step trains (one version in flight; rollout
    hears the version once inference serves it): services/trainer/lodestar_trainer/weights/pushing.py."""
    attention: AttentionBackend = "explicit"
    """Attention backend of the forward/backward (wiring resolves the setting's "auto" by device)."""


@dataclass
class _Plan:
    """What every rank does next (rank 0 decides; broadcast under torchrun)."""

    groups: list[GroupSamples] = field(default_factory=list)
    read: int = 0
    """Groups consumed from the stream for this plan (trained, dropped or in a skipped step)."""
    no_signal: int = 0
    no_signal_rewards: list[float] = field(default_factory=list)
    """The rewards of those groups' scored sessions: they count in the step's reward metrics (what the policy
    scores), though they are not trained on."""
    error: str = ""
    stop: StopReason | None = None
    """Stop instead of stepping, and why."""
    save: bool = False
    """With stop: write a checkpoint before stopping."""
    checkpoint: Path | None = None
    """Instead of a step: write a checkpoint here (SaveCheckpoint; every rank writes its shard)."""
    keepalive: bool = False
    """Instead of a step: nothing (rank 0 still waits for groups; the other ranks' collective ends in time)."""


@dataclass
class Trainer:
    """Owns model, optimizer and loop state; `run()` is the body of the training thread."""

    config: LoopConfig
    model: Any
    optimizer: torch.optim.Optimizer
    state: TrainState
    board: StatusBoard
    parallel: Parallel = field(default_factory=Parallel)
    source: GroupSource | None = None
    publisher: Publisher | None = None
    metrics: MetricsWriter | None = None
    reference: Any = None
    compute: ComputeCopy | None = None
    """bf16 compute copy of `model` (the fp32 master) in one process / DDP mode (precision.py)."""
    model_files: list[Path] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _save_on_stop: bool = field(default=False, init=False)
    _step_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _saved_step: int = field(default=-1, init=False)
    _pusher: BackgroundPush | None = field(default=None, init=False)
    _counters: dict[str, float] = field(
        default_factory=lambda: {"groups_no_signal": 0.0, "groups_stale": 0.0, "sessions_dropped": 0.0}, init=False
    )
    _partial_credit: bool = field(default=False, init=False)
    """A reward other than 0 or 1 has been read (see `_pass_threshold`)."""
    _inbox: Inbox | None = field(default=None, init=False)
    """Rank 0's groups and SaveCheckpoint requests while the loop runs (inbox.py); None when it does not."""
    _inbox_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _pending: tuple[_Plan, int] | None = field(default=None, init=False)
    """A plan whose groups were being read when a request came, and its run of groups without signal."""
    _asked: SaveRequest | None = field(default=None, init=False)

    # -- the loop --------------------------------------------------------------------------------------

    def run(self) -> None:
        """Train until `steps` are done, Stop, or the run's groups end; FAILED with the reason on an error."""
        with structlog.contextvars.bound_contextvars(run_id=self.config.run_id, rank=self.parallel.rank):
            self._run()

    def _run(self) -> None:
        try:
            device = self._device()
            if device.type == "cuda":  # the current CUDA device is per thread: set it in the one that trains
                torch.cuda.set_device(device)
            self._sync_inference()
            if self.parallel.is_main:
                with self._inbox_lock:
                    self._inbox = Inbox(self.source.groups(self.state.groups_read) if self.source else None)
            last = self.state.step + self.config.steps if self.config.steps else None
            while last is None or self.state.step < last:
                self.board.update(phase=Phase.WAITING)
                plan = self.parallel.broadcast(self._next_plan() if self.parallel.is_main else None)
                assert plan is not None
                if plan.keepalive:
                    continue
                if plan.checkpoint is not None:
                    self._save_requested(plan.checkpoint)
                    continue
                if plan.stop is not None:
                    break
                if plan.error:
                    self._skip(plan)
                    continue
                self.board.update(phase=Phase.TRAINING)
                try:
                    with self._step_lock:
                        self.train_step(plan)
                except BadGroupError as error:  # raised before anything changed: the step is skipped
                    plan.error = error.message
                    self._skip(plan)
            else:  # steps done; a Stop asked meanwhile still gets its checkpoint (alone: no rank must agree)
                plan = _Plan(stop=StopReason.STEPS_DONE, save=self._save_on_stop and not self.parallel.distributed)
            if self._pusher is not None:
                self._pusher.wait()  # inference serves the last version (or its push's error fails the run)
            if plan.save or (self.config.checkpoint_every and 0 < self.state.step != self._saved_step):
                self.save(None)
            self.board.update(phase=Phase.STOPPED, stop_reason=plan.stop)
        except Exception as error:
            reason = error.message if isinstance(error, LodestarError) else f"{type(error).__name__}: {error}"
            _log.exception("trainer failed", error=reason, step=self.state.step)
            self.board.update(phase=Phase.FAILED, error=reason)
        finally:
            self._close_inbox()
            if self._pusher is not None:
                self._pusher.close()
            if self.metrics is not None:
                self.metrics.close()

    def train_step(self, plan: _Plan) -> StepRecord:
        """One optimizer step on the plan's groups (module docstring, steps 2-6)."""
        started = self._clock()
        sequences, stats = build_step(plan.groups, self.config.builder, self.config.vocab_size)
        micro_batches, split = pack_step(sequences, self.config.micro_batch_tokens)
        if split.over_budget_parts:
            _log.warning("micro-batch over budget: a path from the root is longer than the budget",
                         parts=split.over_budget_parts, tokens=split.longest_part,
                         micro_batch_tokens=self.config.micro_batch_tokens)  # fmt: skip
        built = self._clock()

        harness_of = {sample.sample_index: sample.harness for group in plan.groups for sample in group.samples}
        tally = MismatchTally(harness_of, version=self.state.policy_version)
        totals, grad_norm, mismatch = self._forward_backward(micro_batches, tally)
        backward_done = self._clock()

        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.compute is not None:
            self.compute.weights_from_master()
        version_before = self.state.policy_version
        self._advance(steps=1, version=1, read=plan.read)
        optimized = self._clock()

        push_bytes, push_wait = self._publish()
        pushed = self._clock()

        seconds = {
            "time_build": built - started,
            "time_forward_backward": backward_done - built,
            "time_optimizer": optimized - backward_done,
            "time_push": pushed - optimized,
        }
        self._counters["groups_no_signal"] += plan.no_signal
        values = step_values(
            groups=plan.groups,
            no_signal_rewards=plan.no_signal_rewards,
            stats=stats,
            split=split,
            micro_batches=len(micro_batches),
            loss=totals,
            grad_norm=grad_norm,
            lr=float(self.optimizer.param_groups[0]["lr"]),
            seconds=seconds,
            version_before=version_before,
            pass_threshold=self._pass_threshold([r for g in plan.groups for r in g.rewards] + plan.no_signal_rewards),
            counters=self._counters,
            push_bytes=push_bytes,
        )
        values["push_wait_s"] = push_wait
        values.update(mismatch.values())
        record = StepRecord(self.state.step, self.state.policy_version, values)
        self._warn_on_mismatch(mismatch)
        if self.parallel.is_main and self.metrics is not None:
            self.metrics.write(record)
        _log.info("step", step=record.step, policy_version=record.policy_version, **_headline(values))
        self.board.publish_step(record, step=self.state.step, policy_version=self.state.policy_version)
        if self._checkpoint_due():
            self.save(None)
        return record

    # -- the parts ---------------------------------------------------------------------------------------

    def _next_plan(self) -> _Plan:
        """Read groups until `groups_per_step` have signal (or a bad group, the end of the run, Stop, or
        `stop_after_no_signal_groups` groups in a row without signal).

        The run of groups without signal is counted within the plan: the previous plan ended with a group that
        had signal. Stale groups neither extend nor break it (their rewards are not looked at).

        A SaveCheckpoint request (or a quiet KEEPALIVE_S) interrupts the reading: the plan read so far is kept
        for the next call, and the request becomes this plan."""
        plan, without_signal = self._pending or (_Plan(), 0)
        self._pending = None
        limit = self.config.stop_after_no_signal_groups
        while len(plan.groups) < self.config.groups_per_step:
            assert self._inbox is not None
            group = self._inbox.next(KEEPALIVE_S) if not self._stop.is_set() else None
            if isinstance(group, SaveRequest) or group is IDLE:
                self._pending = (plan, without_signal)
                return self._between_steps(group)
            if group is None:
                return self._stop_plan(plan, StopReason.STOP_REQUESTED if self._stop.is_set() else StopReason.RUN_ENDED)
            plan.read += 1
            behind = self.state.policy_version - group.min_policy_version
            if 0 <= self.config.max_staleness < behind:
                self._counters["groups_stale"] += 1
                _log.info("stale group dropped", group_id=group.group_id, versions_behind=behind)
                continue
            try:
                samples = group_samples(
                    group,
                    run_id=self.config.run_id,
                    advantage=self.config.advantage,
                    first_index=sum(len(kept.samples) for kept in plan.groups),
                )
            except BadGroupError as error:
                plan.error = error.message
                return plan
            self._counters["sessions_dropped"] += samples.dropped_sessions
            if samples.has_signal:
                plan.groups.append(samples)
                without_signal = 0
                continue
            plan.no_signal += 1
            plan.no_signal_rewards += samples.rewards
            without_signal += 1
            _log.info("group without signal dropped", group_id=samples.group_id, rewards=samples.rewards)
            if 0 < limit <= without_signal:
                return self._stop_plan(plan, StopReason.NO_SIGNAL)
        return plan

    def _between_steps(self, request: SaveRequest | Idle) -> _Plan:
        """The plan of a SaveCheckpoint request (its directory resolved here, on rank 0), or a keepalive."""
        if not isinstance(request, SaveRequest) or not request.done.set_running_or_notify_cancel():
            return _Plan(keepalive=True)  # idle, or a request whose caller gave up
        self._asked = request
        return _Plan(checkpoint=request.path or step_dir(self.config.checkpoint_dir, self.state.step))

    def _save_requested(self, target: Path) -> None:
        """Serve SaveCheckpoint between steps on every rank; its error goes to the caller (rank 0), and the loop
        goes on (a failed save raises on every rank alike: sharded.py)."""
        request, self._asked = self._asked, None
        try:
            with self._step_lock:
                saved = self.save(target), self.state.step
        except Exception as error:
            _log.warning("requested checkpoint not written", path=str(target), error=str(error))
            if request is not None:
                request.done.set_exception(error)
        else:
            if request is not None:
                request.done.set_result(saved)

    def _close_inbox(self) -> None:
        """The loop ends: requests not served are served alone (one process) or refused (torchrun)."""
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
                with self._step_lock:
                    request.done.set_result((self.save(request.path), self.state.step))
            except Exception as error:
                request.done.set_exception(error)

    def _stop_plan(self, plan: _Plan, reason: StopReason) -> _Plan:
        """Stop before `plan` had its groups (the run ended, Stop, no signal): publish what the groups it read
        scored (the last policies' reward, which no step's metrics show)."""
        rewards = [reward for kept in plan.groups for reward in kept.rewards] + plan.no_signal_rewards
        reward_mean = mean_std(rewards)[0]
        _log.info("trainer stopping", reason=reason.value, step=self.state.step, untrained_groups=plan.read,
                  untrained_reward_mean=round(reward_mean, 4))  # fmt: skip
        self.board.update(untrained_groups=plan.read, untrained_reward_mean=reward_mean)
        return _Plan(stop=reason, save=self._save_on_stop)

    def _skip(self, plan: _Plan) -> None:
        self._counters["groups_no_signal"] += plan.no_signal
        skipped = self.board.snapshot().skipped_steps + 1
        self._advance(steps=0, version=0, read=plan.read, skipped=1)
        _log.warning("step skipped", reason=plan.error, skipped_steps=skipped, step=self.state.step)
        self.board.update(error=plan.error, skipped_steps=skipped)

    def _forward_backward(
        self, micro_batches: list[MicroBatch], mismatch: MismatchTally
    ) -> tuple[LossOutput | None, float, MismatchTally]:
        """Accumulate the step gradient over this rank's micro-batches; (merged loss metrics, grad norm, the
        step's trainer-vs-inference mismatch by harness)."""
        norm = LossNormalizer.of(micro_batches)
        mine = self.parallel.shard(micro_batches)
        totals: LossOutput | None = None
        self.optimizer.zero_grad(set_to_none=True)
        net = self.compute.model if self.compute is not None else self.model
        for index, (batch, weight) in enumerate(mine):
            self.parallel.set_grad_sync(net, index == len(mine) - 1)
            new = target_logprobs(net, batch, attention=self.config.attention)
            old = new.detach() if self.config.behaviour_correction == "tis" else None
            ref = self._reference_logprobs(batch)
            output = policy_loss(new, batch, self.config.loss, norm, old_logprobs=old, ref_logprobs=ref)
            torch.autograd.backward(output.loss * (weight * self.parallel.world))
            if weight:
                totals = output if totals is None else totals.merge(output)
                mismatch.add(new, batch)
        if self.compute is not None:
            self.compute.grads_to_master()
        self.parallel.reduce_replicated_grads(self.model)
        totals = loss_over_ranks(self.parallel, totals)
        grad_norm = self.parallel.clip_grad_norm(self.model, self.config.max_grad_norm)
        return totals, grad_norm, mismatch.over_ranks(self.parallel)

    def _pass_threshold(self, rewards: list[float]) -> float | None:
        """The configured threshold; unset, 1.0 while every reward read so far is 0 or 1, else None (no
        pass rate: partial credit defines no passing)."""
        if self.config.pass_threshold is not None:
            return self.config.pass_threshold
        self._partial_credit = self._partial_credit or any(r not in (0.0, 1.0) for r in rewards)
        return None if self._partial_credit else 1.0

    def _warn_on_mismatch(self, mismatch: MismatchTally) -> None:
        """Loudly (a warning line, GetStatus.warning until a later step replaces it) when some harness's
        sessions were trained on logprobs the trainer does not reproduce."""
        above = mismatch.above(self.config.mismatch_warn_nats)
        if not above:
            return
        text = warning_text(self.state.step, above, self.config.mismatch_warn_nats)
        _log.warning("trainer-inference logprob mismatch", step=self.state.step, by_harness=above,
                     threshold=self.config.mismatch_warn_nats)  # fmt: skip
        self.board.update(warning=text)

    def _reference_logprobs(self, batch: MicroBatch) -> torch.Tensor | None:
        if self.reference is None or not self.config.loss.kl_coef:
            return None
        with torch.no_grad():
            logprobs: torch.Tensor = target_logprobs(self.reference, batch, attention=self.config.attention)
            return logprobs

    def _publish(self) -> tuple[int, float]:
        """Push the new weights to inference and tell rollout (rank 0; the state gather is collective); with
        `async_push` the push goes on in the background. Returns (payload bytes, seconds spent waiting for
        inference to serve a version: the whole push when synchronous, the previous one's rest when not)."""
        if not self.parallel.distributed and self.publisher is None and self.source is None:
            return 0, 0.0
        weights = self.parallel.full_state(self.model)
        if not self.parallel.is_main:
            return 0, 0.0
        if self.config.async_push and self.publisher is not None:
            if self._pusher is None:
                self._pusher = BackgroundPush(self.publisher, self._report_version)
            return self._pusher.submit(weights, self.state.policy_version, copy=shares_memory(weights, self.model))
        result = self.publisher.publish(weights, self.state.policy_version) if self.publisher else None
        self._report_version(self.state.policy_version)
        return (result.payload_bytes, result.seconds) if result else (0, 0.0)

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

    def _report_version(self, version: int) -> None:
        """Tell rollout that inference serves `version` (best effort: the next step reports a newer one)."""
        if self.source is None:
            return
        try:
            self.source.report_policy_version(version)
        except LodestarError as error:
            _log.warning("policy version not reported", policy_version=version, error=error.message)

    def _sync_inference(self) -> None:
        """On a resumed run, make inference serve the resumed weights if it serves an older version."""
        if not self.state.policy_version:
            return
        behind = None
        if self.parallel.is_main and self.publisher is not None:
            behind = self.publisher.served_version() < self.state.policy_version
        if not self.parallel.broadcast(behind):
            return
        weights = self.parallel.full_state(self.model)
        if self.parallel.is_main and self.publisher is not None:
            self.publisher.publish(weights, self.state.policy_version)
            _log.info("resumed weights pushed", policy_version=self.state.policy_version)

    def _advance(self, *, steps: int, version: int, read: int, skipped: int = 0) -> None:
        s = self.state
        self.state = TrainState(
            step=s.step + steps,
            policy_version=s.policy_version + version,
            run_id=s.run_id,
            groups_read=s.groups_read + read,
            skipped_steps=s.skipped_steps + skipped,
        )

    def _checkpoint_due(self) -> bool:
        every = self.config.checkpoint_every
        return bool(every) and self.state.step > 0 and self.state.step % every == 0

    # -- control (any thread) ----------------------------------------------------------------------------

    def request_stop(self, *, save_checkpoint: bool = False) -> None:
        """Finish the current step, then stop (saving a checkpoint first when asked)."""
        self._save_on_stop = self._save_on_stop or save_checkpoint
        self._stop.set()
        if self.source is not None:
            self.source.cancel()
        with self._inbox_lock:
            if self._inbox is not None:
                self._inbox.wake()

    def save(self, path: Path | None) -> Path:
        """Write a checkpoint of the current state (between steps); returns its directory."""
        target = path or step_dir(self.config.checkpoint_dir, self.state.step)
        if self.parallel.distributed:
            save_sharded(target, parallel=self.parallel, model=self.model, optimizer=self.optimizer,
                         state=self.state, model_files=self.model_files)  # fmt: skip
            return self._saved(target)
        weights = self.parallel.full_state(self.model)
        optimizer = self.parallel.optimizer_state(self.model, self.optimizer)
        if self.parallel.is_main:
            save_checkpoint(
                target, weights=weights, optimizer=optimizer, state=self.state, model_files=self.model_files
            )
        return self._saved(target)

    def _saved(self, target: Path) -> Path:
        if self.parallel.is_main:
            _log.info("checkpoint written", path=str(target), step=self.state.step)
            self.board.update(last_checkpoint=str(target))
        self._saved_step = self.state.step
        return target

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
            with self._step_lock:
                return self.save(path), self.state.step
        try:
            return request.done.result(timeout_s)
        except FutureTimeoutError:
            request.done.cancel()
            raise DeadlineExceededError(f"the trainer did not reach a step boundary within {timeout_s:.0f} s") from None


def _headline(values: dict[str, float]) -> dict[str, float]:
    keys = ("loss", "reward_mean", "merge_ratio", "time_step", "clip_fraction", "logprob_diff_max", "policy_drift_max")
    return {key: round(values[key], 5) for key in keys if key in values}
