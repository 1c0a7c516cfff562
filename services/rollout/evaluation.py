"""pass@k of a harness on a task set, from the groups of an evaluation run (`lodestar eval`).

An evaluation is an ordinary run nobody trains on: every task sampled `k` times (group size `k`, early stop
off, staleness bound at its maximum so no group is dropped while some trainer moves the policy on), scored
by the run's verifier. A sample passes when its reward is at least `pass_threshold`. Per task with `n`
scored samples of which `c` pass, pass@k is the unbiased estimator of Chen et al. (2021),
`1 - C(n - c, k) / C(n, k)` (with `n = k` it is "any sample passed"); the run's pass@k is the mean over
tasks that scored at least one sample. Tasks without a scored sample (every attempt an infrastructure
failure) are counted apart, never as failures of the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from math import comb
from typing import Any

from lodestar.v1 import rollout_pb2

MAX_STALENESS = 2**32 - 1
"""`max_staleness` of an evaluation run: never drop a group for staleness."""
_SCORED = (rollout_pb2.SESSION_OUTCOME_SCORED, rollout_pb2.SESSION_OUTCOME_TIMED_OUT)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with `n` samples, `c` of them passing (k is capped at n)."""
    if n <= 0:
        raise ValueError("pass@k needs at least one sample")
    k = min(k, n)
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class HarnessScore:
    harness: str
    run_id: str
    k: int
    tasks: int
    """Tasks with at least one scored sample."""
    unscored_tasks: int
    samples: int
    passed: int
    reward_mean: float
    pass_at_1: float
    pass_at_k: float
    per_task: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(
    harness: str,
    run_id: str,
    task_ids: Sequence[str],
    groups: Sequence[rollout_pb2.Group],
    *,
    k: int,
    pass_threshold: float,
) -> HarnessScore:
    """pass@1 / pass@k of one evaluation run from its delivered groups (tasks without a group are unscored)."""
    rewards: dict[str, list[float]] = {task_id: [] for task_id in task_ids}
    for group in groups:
        rewards.setdefault(group.task_id, []).extend(s.reward for s in group.sessions if s.outcome in _SCORED)
    per_task: dict[str, dict[str, float]] = {}
    for task_id, values in rewards.items():
        if values:
            c = sum(1 for r in values if r >= pass_threshold)
            per_task[task_id] = {
                "samples": len(values),
                "passed": c,
                "pass@1": pass_at_k(len(values), c, 1),
                f"pass@{k}": pass_at_k(len(values), c, k),
            }
    scored = [r for values in rewards.values() for r in values]
    tasks = len(per_task)
    return HarnessScore(
        harness=harness,
        run_id=run_id,
        k=k,
        tasks=tasks,
        unscored_tasks=len(rewards) - tasks,
        samples=len(scored),
        passed=sum(1 for r in scored if r >= pass_threshold),
        reward_mean=sum(scored) / len(scored) if scored else 0.0,
        pass_at_1=sum(t["pass@1"] for t in per_task.values()) / tasks if tasks else 0.0,
        pass_at_k=sum(t[f"pass@{k}"] for t in per_task.values()) / tasks if tasks else 0.0,
        per_task=per_task,
    )
