"""The GRPO policy loss of one micro-batch, summable over the micro-batches of an optimizer step.

Per target token i (a token the policy sampled; N of them in a micro-batch, shapes [N]):

    ratio_i   = exp(new_i - old_i)            old = behaviour (captured inference) logprob, or the
                                              trainer's recompute `old_logprobs` when given
    surr_i    = -min(ratio_i * A_i, clip(ratio_i, 1 - clip_low, 1 + clip_high) * A_i)
    tis_i     = min(exp(old_i - behaviour_i), tis_cap)   (only with `old_logprobs`; detached)
    kl_i      = exp(ref_i - new_i) - (ref_i - new_i) - 1 (k3 estimator; only with `ref_logprobs`)
    loss_i    = tis_i * surr_i + kl_coef * kl_i

Aggregation over the step (all micro-batches, counted by `LossNormalizer.of`):
- TOKEN: sum_i loss_i / (targets in the step)          (DAPO / Dr. GRPO token-level mean)
- SEQUENCE_MEAN: sum_i loss_i / (targets of i's sample) / (samples in the step)   (the GRPO paper)

`policy_loss` returns this micro-batch's share of that step mean, so the step loss is the SUM of the
micro-batch losses and `loss.backward()` per micro-batch accumulates exactly the step gradient.

Deviations from textbook GRPO (Shao et al. 2024), on purpose:
- the behaviour policy is the inference engine's captured logprobs (the distribution actually sampled
  from), not a trainer recompute; with `old_logprobs` the ratio is taken against the recompute and the
  inference/trainer mismatch is corrected by truncated importance sampling (TIS, cap `tis_cap`);
- asymmetric clipping (clip_low 0.2, clip_high 0.28: DAPO's clip-higher);
- token-level aggregation by default (DAPO), sequence-mean as an option;
- KL to a reference is off by default (kl_coef 0) and uses the k3 estimator when on; it is added to the
  loss, not folded into the reward;
- advantages are group-relative per sample (lodestar_trainer/step/advantages.py) and equal on every token.
Metrics are sums and counts (and a max) so they combine across micro-batches with `merge`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import torch

from lodestar_trainer.data.batch import MicroBatch


class Aggregation(StrEnum):
    TOKEN = "token"
    SEQUENCE_MEAN = "sequence_mean"


class LossParameters(Protocol):
    """What the loss reads of its configuration: a LossConfig, or the trainer's `loss` settings section."""

    @property
    def clip_low(self) -> float: ...
    @property
    def clip_high(self) -> float: ...
    @property
    def aggregation(self) -> str: ...
    @property
    def kl_coef(self) -> float: ...
    @property
    def tis_cap(self) -> float | None: ...


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    aggregation: Aggregation = Aggregation.TOKEN
    kl_coef: float = 0.0
    tis_cap: float | None = 2.0
    """Cap of the truncated importance weight exp(old - behaviour); None disables the correction."""


@dataclass(frozen=True)
class LossNormalizer:
    """Step-level counts that make micro-batch losses add up to the step loss."""

    total_targets: int
    targets_per_sample: dict[int, int] = field(default_factory=dict)
    samples: int = 0

    @classmethod
    def of(cls, batches: Sequence[MicroBatch]) -> LossNormalizer:
        counts = Counter(sample for batch in batches for sample in batch.target_samples)
        return cls(total_targets=sum(counts.values()), targets_per_sample=dict(counts), samples=len(counts))


@dataclass
class LossOutput:
    """A micro-batch's loss and its metric sums (combine with `merge`, read with `summary`)."""

    loss: torch.Tensor
    """Scalar: this micro-batch's share of the step loss (differentiable)."""
    targets: int
    clipped: int
    """Targets whose surrogate took the clipped branch (no gradient through the ratio)."""
    ratio_sum: float
    kl_sum: float
    mismatch_abs_sum: float
    """Sum over targets of |trainer logprob - inference logprob| (old_logprobs if given, else new)."""
    mismatch_abs_max: float
    tis_clipped: int = 0

    def merge(self, other: LossOutput) -> LossOutput:
        """Combined metrics; `loss` becomes the detached sum (for logging, not for backward)."""
        return LossOutput(
            loss=(self.loss.detach() + other.loss.detach()),
            targets=self.targets + other.targets,
            clipped=self.clipped + other.clipped,
            ratio_sum=self.ratio_sum + other.ratio_sum,
            kl_sum=self.kl_sum + other.kl_sum,
            mismatch_abs_sum=self.mismatch_abs_sum + other.mismatch_abs_sum,
            mismatch_abs_max=max(self.mismatch_abs_max, other.mismatch_abs_max),
            tis_clipped=self.tis_clipped + other.tis_clipped,
        )

    def summary(self) -> dict[str, float]:
        count = max(self.targets, 1)
        return {
            "loss": float(self.loss.detach()),
            "targets": float(self.targets),
            "clip_fraction": self.clipped / count,
            "ratio_mean": self.ratio_sum / count,
            "kl": self.kl_sum / count,
            "mismatch_mean": self.mismatch_abs_sum / count,
            "mismatch_max": self.mismatch_abs_max,
            "tis_clip_fraction": self.tis_clipped / count,
        }


def _weights(batch: MicroBatch, config: LossParameters, norm: LossNormalizer, device: torch.device) -> torch.Tensor:
    """[N] weight of each target in the step mean."""
    if config.aggregation == Aggregation.TOKEN:
        return torch.full((len(batch.target_samples),), 1.0 / max(norm.total_targets, 1), device=device)
    if any(sample not in norm.targets_per_sample for sample in batch.target_samples):
        raise ValueError("LossNormalizer was not built from this micro-batch's step")
    per_sample = [1.0 / (norm.targets_per_sample[sample] * norm.samples) for sample in batch.target_samples]
    return torch.tensor(per_sample, dtype=torch.float32, device=device)


def policy_loss(
    new_logprobs: torch.Tensor,
    batch: MicroBatch,
    config: LossParameters,
    norm: LossNormalizer,
    *,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> LossOutput:
    """The loss of one micro-batch (module docstring). new/old/ref logprobs: [N] fp32, N = targets."""
    count = len(batch.target_tokens)
    if new_logprobs.shape != (count,):
        raise ValueError(f"new_logprobs has shape {tuple(new_logprobs.shape)}, expected ({count},)")
    device = new_logprobs.device
    new = new_logprobs.float()
    behaviour = torch.tensor(batch.behaviour_logprobs, dtype=torch.float32, device=device)
    advantages = torch.tensor(batch.advantages, dtype=torch.float32, device=device)
    old = behaviour if old_logprobs is None else old_logprobs.detach().float()
    ratio = torch.exp(new - old)
    clipped_ratio = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    unclipped, clipped = ratio * advantages, clipped_ratio * advantages
    per_token = -torch.minimum(unclipped, clipped)
    tis_clipped = 0
    if old_logprobs is not None and config.tis_cap is not None:
        raw = torch.exp(old - behaviour)
        tis_clipped = int((raw > config.tis_cap).sum())
        per_token = per_token * raw.clamp(max=config.tis_cap)
    kl = torch.zeros_like(new)
    if ref_logprobs is not None:
        log_ratio = ref_logprobs.detach().float() - new
        kl = torch.exp(log_ratio) - log_ratio - 1.0
        per_token = per_token + config.kl_coef * kl
    loss = (per_token * _weights(batch, config, norm, device)).sum()
    mismatch = ((old if old_logprobs is not None else new.detach()) - behaviour).abs()
    return LossOutput(
        loss=loss,
        targets=count,
        clipped=int((clipped < unclipped).sum()),
        ratio_sum=float(ratio.detach().sum()),
        kl_sum=float(kl.detach().sum()),
        mismatch_abs_sum=float(mismatch.sum()),
        mismatch_abs_max=float(mismatch.max()) if count else 0.0,
        tis_clipped=tis_clipped,
    )
