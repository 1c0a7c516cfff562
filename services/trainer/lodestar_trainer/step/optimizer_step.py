"""One optimizer step's arithmetic over this rank's micro-batches, and the step's statistics.

Forward/backward per micro-batch under one step-level normalizer (gradients accumulate to exactly the step
gradient), the gradient brought to the fp32 master and across ranks, the norm clipped, AdamW. Then the metric
values of the step (stepstats.py) and the trainer-vs-inference mismatch warning (mismatch.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lodestar.logging import get_logger
from lodestar_trainer.data.batch import BuildStats, MicroBatch
from lodestar_trainer.data.groups import GroupSamples
from lodestar_trainer.data.split import SplitStats
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.settings import LossSettings, MetricsSettings, OptimizerSettings
from lodestar_trainer.step.forward import AttentionBackend, target_logprobs
from lodestar_trainer.step.loss import LossNormalizer, LossOutput, policy_loss
from lodestar_trainer.step.mismatch import MismatchTally, warning_text
from lodestar_trainer.step.precision import ComputeCopy
from lodestar_trainer.step.stepstats import loss_over_ranks, step_values

_log = get_logger("trainer")


@dataclass(frozen=True)
class Gradient:
    """The accumulated step gradient's loss metrics (merged over ranks), its clipped norm, and the mismatch."""

    loss: LossOutput | None
    norm: float
    mismatch: MismatchTally


@dataclass
class OptimizerStep:
    """The model, its optimizer and what a step computes with: `accumulate`, then `apply`. The settings are the
    trainer's `loss`, `optimizer` and `metrics` sections; `attention` the resolved backend."""

    loss: LossSettings
    optimization: OptimizerSettings
    metrics: MetricsSettings
    attention: AttentionBackend
    model: Any
    optimizer: torch.optim.Optimizer
    parallel: Parallel
    compute: ComputeCopy | None = None
    """bf16 compute copy of `model` (the fp32 master) in one process / DDP mode (precision.py)."""
    reference: Any = None
    _partial_credit: bool = field(default=False, init=False)
    """A reward other than 0 or 1 has been read (see `pass_threshold`)."""

    def accumulate(self, micro_batches: list[MicroBatch], mismatch: MismatchTally) -> Gradient:
        """Accumulate the step gradient over this rank's micro-batches; clip its norm."""
        norm = LossNormalizer.of(micro_batches)
        mine = self.parallel.shard(micro_batches)
        totals: LossOutput | None = None
        self.optimizer.zero_grad(set_to_none=True)
        net = self.compute.model if self.compute is not None else self.model
        for index, (batch, weight) in enumerate(mine):
            self.parallel.set_grad_sync(net, index == len(mine) - 1)
            new = target_logprobs(net, batch, attention=self.attention)
            old = new.detach() if self.loss.behaviour_correction == "tis" else None
            ref = self._reference_logprobs(batch)
            output = policy_loss(new, batch, self.loss, norm, old_logprobs=old, ref_logprobs=ref)
            torch.autograd.backward(output.loss * (weight * self.parallel.world))
            if weight:
                totals = output if totals is None else totals.merge(output)
                mismatch.add(new, batch)
        if self.compute is not None:
            self.compute.grads_to_master()
        self.parallel.reduce_replicated_grads(self.model)
        totals = loss_over_ranks(self.parallel, totals)
        grad_norm = self.parallel.clip_grad_norm(self.model, self.optimization.max_grad_norm)
        return Gradient(totals, grad_norm, mismatch.over_ranks(self.parallel))

    def apply(self) -> None:
        """The optimizer step on the accumulated gradient; the compute copy follows the master."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.compute is not None:
            self.compute.weights_from_master()

    def statistics(
        self,
        *,
        groups: list[GroupSamples],
        no_signal_rewards: list[float],
        stats: BuildStats,
        split: SplitStats,
        micro_batches: int,
        gradient: Gradient,
        seconds: Mapping[str, float],
        version_before: int,
        counters: Mapping[str, float],
        push: tuple[int, float],
    ) -> dict[str, float]:
        """The step's metric values (names: lodestar_trainer/metrics.py); `push` is (bytes, seconds waited)."""
        values = step_values(
            groups=groups,
            no_signal_rewards=no_signal_rewards,
            stats=stats,
            split=split,
            micro_batches=micro_batches,
            loss=gradient.loss,
            grad_norm=gradient.norm,
            lr=float(self.optimizer.param_groups[0]["lr"]),
            seconds=seconds,
            version_before=version_before,
            pass_threshold=self.pass_threshold([r for g in groups for r in g.rewards] + no_signal_rewards),
            counters=counters,
            push_bytes=push[0],
        )
        values["push_wait_s"] = push[1]
        values.update(gradient.mismatch.values())
        return values

    def pass_threshold(self, rewards: list[float]) -> float | None:
        """The configured threshold; unset, 1.0 while every reward read so far is 0 or 1, else None (no
        pass rate: partial credit defines no passing)."""
        if self.metrics.pass_threshold is not None:
            return self.metrics.pass_threshold
        self._partial_credit = self._partial_credit or any(r not in (0.0, 1.0) for r in rewards)
        return None if self._partial_credit else 1.0

    def mismatch_warning(self, mismatch: MismatchTally, step: int) -> str | None:
        """Loudly (a warning line; the text for GetStatus.warning) when some harness's sessions were trained on
        logprobs the trainer does not reproduce; None when none is above the threshold."""
        above = mismatch.above(self.metrics.mismatch_warn_nats)
        if not above:
            return None
        _log.warning(
            "trainer-inference logprob mismatch", step=step, by_harness=above, threshold=self.metrics.mismatch_warn_nats
        )
        return warning_text(step, above, self.metrics.mismatch_warn_nats)

    def _reference_logprobs(self, batch: MicroBatch) -> torch.Tensor | None:
        if self.reference is None or not self.loss.kl_coef:
            return None
        with torch.no_grad():
            logprobs: torch.Tensor = target_logprobs(self.reference, batch, attention=self.attention)
            return logprobs
