"""The trainer-vs-inference logprob mismatch of a step, per harness, the policy drift of its stale tokens, and the
warning when the mismatch is too large.

Before an update the trainer's logprob of a sampled token must equal the one inference captured: both
compute the same distribution (the run's sampling policy; lodestar_trainer/step/forward.py). A gap means the
PPO ratio and the TIS weight compare two different distributions, so the update for those tokens is
biased: a harness whose sampling was not overridden, a model inference and trainer load differently, a
precision problem. Only tokens sampled by the policy version the trainer holds when the step starts are
compared: a token of an older version (a stale sample) differs by the policy's own updates since, which is
what the importance weight corrects, not a mismatch (with the quickstart's large learning rate that is
several nats). `MismatchTally` sums |trainer - inference| over the same-version targets by the harness that ran
each target's session (`Sample.harness`), and apart from them over the stale targets. `values()` gives the step
metrics: the mismatch `logprob_diff_mean` and `logprob_diff_max` (every harness) and `logprob_diff_mean/<harness>`,
`logprob_diff_max/<harness>` (absent in a step without same-version targets), and the drift `policy_drift_mean`,
`policy_drift_max` (absent in a step without stale targets); `above()` gives the harnesses whose mean mismatch
passed the trainer's `mismatch_warn_nats`. docs/trainer.md ("Mismatch and policy drift") reads both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from lodestar_trainer.data.batch import MicroBatch
from lodestar_trainer.parallel.distributed import Parallel

UNKNOWN_HARNESS = "unknown"
"""The key of sessions whose result did not name its harness (results of older nodes)."""


@dataclass
class MismatchTally:
    """Sums, counts and maxima of |trainer - inference| logprob by harness (combine ranks with `over_ranks`)."""

    harness_of: Mapping[int, str]
    """Harness of each sample index of the step."""
    version: int | None = None
    """The policy version the trainer holds (only its tokens are compared); None: every token."""
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    drift_sum: float = 0.0
    """Sum of |trainer - inference| over the stale targets (sampled by an older version)."""
    drift_count: float = 0.0
    drift_max: float = 0.0

    def add(self, trainer_logprobs: torch.Tensor, batch: MicroBatch) -> None:
        """Tally one micro-batch: `trainer_logprobs` [N] against `batch.behaviour_logprobs` [N]."""
        gap = (trainer_logprobs.detach().float().cpu() - torch.tensor(batch.behaviour_logprobs)).abs().tolist()
        versions: list[int | None] = list(batch.versions) or [None] * len(gap)
        for sample, value, version in zip(batch.target_samples, gap, versions, strict=True):
            if self.version is not None and version is not None and version != self.version:
                self.drift_sum += value  # a stale token: the policy moved since it was sampled
                self.drift_count += 1.0
                self.drift_max = max(self.drift_max, value)
                continue
            harness = self.harness_of.get(sample) or UNKNOWN_HARNESS
            self.sums[harness] = self.sums.get(harness, 0.0) + value
            self.counts[harness] = self.counts.get(harness, 0.0) + 1.0
            self.maxima[harness] = max(self.maxima.get(harness, 0.0), value)

    def over_ranks(self, parallel: Parallel) -> MismatchTally:
        """The tally of every rank's micro-batches (every rank holds the same plan, so the same harnesses)."""
        if not parallel.distributed:
            return self
        names = sorted(set(self.harness_of.values()) | {UNKNOWN_HARNESS})
        *sums, drift_sum = parallel.sum([self.sums.get(name, 0.0) for name in names] + [self.drift_sum])
        *counts, drift_count = parallel.sum([self.counts.get(name, 0.0) for name in names] + [self.drift_count])
        *maxima, drift_max = parallel.max([self.maxima.get(name, 0.0) for name in names] + [self.drift_max])
        kept = [index for index, count in enumerate(counts) if count]
        return MismatchTally(
            self.harness_of,
            self.version,
            sums={names[i]: sums[i] for i in kept},
            counts={names[i]: counts[i] for i in kept},
            maxima={names[i]: maxima[i] for i in kept},
            drift_sum=drift_sum,
            drift_count=drift_count,
            drift_max=drift_max,
        )

    def means(self) -> dict[str, float]:
        return {name: self.sums[name] / count for name, count in self.counts.items() if count}

    def values(self) -> dict[str, float]:
        """The step metrics (module docstring): the mismatch, step-wide and by harness, and the policy drift."""
        values: dict[str, float] = {}
        count = sum(self.counts.values())
        if count:
            values["logprob_diff_mean"] = sum(self.sums.values()) / count
            values["logprob_diff_max"] = max(self.maxima.values())
        if self.drift_count:
            values["policy_drift_mean"] = self.drift_sum / self.drift_count
            values["policy_drift_max"] = self.drift_max
        for name, mean in sorted(self.means().items()):
            values[f"logprob_diff_mean/{name}"] = mean
            values[f"logprob_diff_max/{name}"] = self.maxima[name]
        return values

    def above(self, threshold: float) -> dict[str, float]:
        """Harnesses whose mean mismatch is above `threshold` (0 or less: none), with their means."""
        if threshold <= 0:
            return {}
        return {name: mean for name, mean in sorted(self.means().items()) if mean > threshold}


def warning_text(step: int, above: Mapping[str, float], threshold: float) -> str:
    """The GetStatus warning for a step whose mismatch passed the threshold."""
    parts = ", ".join(f"{name} {mean:.3g}" for name, mean in above.items())
    return (
        f"step {step}: mean |trainer - inference| logprob above {threshold:g} nats ({parts}): the update is "
        "biased for these sessions; check the run's sampling policy and that trainer and inference load the "
        "same model (docs/trainer.md)"
    )
