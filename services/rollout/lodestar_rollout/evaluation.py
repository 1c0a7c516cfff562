"""pass@k of a harness on a task set, from the groups of an evaluation run (`lodestar eval`).

An evaluation is an ordinary run nobody trains on: every task sampled `k` times (group size `k`, early stop
off, staleness bound at its maximum so no group is dropped while some trainer moves the policy on), scored
by the run's verifier. A sample passes when its reward is at least `pass_threshold`. Per task with `n`
scored samples of which `c` pass, pass@k is the unbiased estimator of Chen et al. (2021),
`1 - C(n - c, k) / C(n, k)` (with `n = k` it is "any sample passed"); the run's pass@k is the mean over
tasks that scored at least one sample. Tasks without a scored sample (every attempt an infrastructure
failure) are counted apart, never as failures of the model.

pass@1 comes with a 95% interval: the Wilson score interval of the passing fraction, with the sample count
replaced by its effective size under clustering by task (Kish: the samples of one task are not independent,
so n_eff = p(1 - p) / se^2, where se is the standard error of the mean over tasks of the per-task pass
rates; n_eff is at most the sample count, and is the sample count when every task scored alike). Two runs
whose intervals do not overlap differ by more than sampling noise on this task set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from math import comb, sqrt
from typing import Any

from lodestar.policy_versions import call_version_range
from lodestar.v1 import rollout_pb2

MAX_STALENESS = 2**32 - 1
"""`max_staleness` of an evaluation run: never drop a group for staleness."""
_SCORED = (rollout_pb2.SESSION_OUTCOME_SCORED, rollout_pb2.SESSION_OUTCOME_TIMED_OUT)
_Z95 = 1.959964


def wilson(p: float, n: float, z: float = _Z95) -> tuple[float, float]:
    """The Wilson score interval of a fraction `p` observed over `n` (possibly effective, fractional) trials."""
    if n <= 0:
        return 0.0, 1.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_1_interval(task_rates: Sequence[float], samples: int) -> tuple[float, float]:
    """95% interval of pass@1 from the per-task pass rates and the total sample count (module docstring)."""
    tasks = len(task_rates)
    if tasks == 0:
        return 0.0, 1.0
    p = sum(task_rates) / tasks
    variance = sum((r - p) ** 2 for r in task_rates) / (tasks - 1) if tasks > 1 else 0.0
    se_squared = variance / tasks
    n_eff = float(samples) if se_squared == 0 else min(float(samples), p * (1 - p) / se_squared)
    return wilson(p, max(n_eff, 1.0))


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
    pass_at_1_low: float = 0.0
    """Lower end of pass@1's 95% interval (module docstring)."""
    pass_at_1_high: float = 1.0
    policy_versions: list[int] = field(default_factory=list)
    """The policy versions the scored samples were sampled from (sorted, distinct; from their calls)."""
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
    low, high = pass_at_1_interval([t["pass@1"] for t in per_task.values()], len(scored))
    versions = {
        version
        for group in groups
        for session in group.sessions
        if session.outcome in _SCORED
        for version in _versions(session)
    }
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
        pass_at_1_low=low,
        pass_at_1_high=high,
        policy_versions=sorted(versions),
        per_task=per_task,
    )


def _versions(session: rollout_pb2.SessionResult) -> set[int]:
    return {version for call in session.calls for version in call_version_range(call)}
