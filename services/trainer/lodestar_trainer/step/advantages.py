"""Group-relative advantages: one scalar per sample of a group, from the group's rewards.

Every sampled token of a sample gets its sample's advantage (GRPO has no value model).

- `zscore`: (r - mean) / (std + eps), the GRPO paper's form. `std` is the population std (ddof 0).
- `mean`: r - mean (Dr. GRPO: no std division, so easy and hard groups are not re-weighted).
- `leave_one_out`: r - mean of the OTHER samples (RLOO); equals n/(n-1) * (r - mean).

A group whose rewards are all equal has no signal: every form gives 0 for each sample, so it contributes
no gradient. `has_signal` says so up front, so the loop can count and drop such groups instead of
spending a forward/backward on them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

ZSCORE_EPS = 1e-6
"""Added to the std of a z-score (only matters for nearly-equal rewards)."""
EQUAL_TOLERANCE = 1e-9
"""Rewards closer than this count as equal for `has_signal`."""


class AdvantageKind(StrEnum):
    ZSCORE = "zscore"
    MEAN = "mean"
    LEAVE_ONE_OUT = "leave_one_out"


def has_signal(rewards: Sequence[float]) -> bool:
    """False when the group cannot teach anything: fewer than two samples or all rewards (nearly) equal."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > EQUAL_TOLERANCE


def group_advantages(rewards: Sequence[float], kind: AdvantageKind) -> list[float]:
    """The advantage of each sample of one group, in the order of `rewards` (length n -> length n).

    Raises ValueError on an empty group or a non-finite reward. A group without signal gets all zeros.
    """
    if not rewards:
        raise ValueError("group_advantages needs at least one reward")
    if not all(math.isfinite(reward) for reward in rewards):
        raise ValueError(f"non-finite reward in group: {list(rewards)}")
    if not has_signal(rewards):
        return [0.0] * len(rewards)
    n = len(rewards)
    mean = sum(rewards) / n
    if kind is AdvantageKind.MEAN:
        return [reward - mean for reward in rewards]
    if kind is AdvantageKind.LEAVE_ONE_OUT:
        total = sum(rewards)
        return [reward - (total - reward) / (n - 1) for reward in rewards]
    std = math.sqrt(sum((reward - mean) ** 2 for reward in rewards) / n)
    return [(reward - mean) / (std + ZSCORE_EPS) for reward in rewards]
