"""pass@k math of `lodestar eval` (services/rollout/lodestar_rollout/evaluation.py)."""

from __future__ import annotations

from math import comb

import pytest

from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_rollout.evaluation import pass_at_k, score


@pytest.mark.parametrize(("n", "c", "k"), [(4, 0, 1), (4, 1, 1), (4, 1, 2), (4, 2, 4), (10, 3, 5), (5, 5, 3)])
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int):
    expected = 1.0 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_1_is_the_pass_fraction_and_pass_at_n_is_any():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(2, 1, 8) == 1.0, "k above n is capped at n"
    with pytest.raises(ValueError, match="at least one sample"):
        pass_at_k(0, 0, 1)


def _group(task_id: str, rewards: list[float], infra: int = 0) -> rollout_pb2.Group:
    sessions = [rollout_pb2.SessionResult(reward=r, outcome=rollout_pb2.SESSION_OUTCOME_SCORED) for r in rewards]
    sessions += [rollout_pb2.SessionResult(outcome=rollout_pb2.SESSION_OUTCOME_INFRA_FAILED) for _ in range(infra)]
    return rollout_pb2.Group(task_id=task_id, sessions=sessions)


def test_score_averages_over_scored_tasks_and_counts_unscored_apart():
    groups = [_group("a", [1.0, 0.0], infra=1), _group("b", [0.5, 0.0])]

    result = score("pi", "run-1", ["a", "b", "c"], groups, k=2, pass_threshold=0.5)

    assert (result.tasks, result.unscored_tasks, result.samples, result.passed) == (2, 1, 4, 2)
    assert result.pass_at_1 == pytest.approx(0.5)
    assert result.pass_at_k == pytest.approx(1.0)
    assert result.reward_mean == pytest.approx(1.5 / 4)
    assert result.as_dict()["per_task"]["a"]["pass@2"] == 1.0


def test_wilson_interval_contains_the_estimate_and_narrows_with_samples():
    from lodestar_rollout.evaluation import wilson

    low, high = wilson(0.3, 100)
    assert low < 0.3 < high
    assert (round(low, 3), round(high, 3)) == (0.219, 0.396), "the textbook Wilson interval for 30/100"
    narrow = wilson(0.3, 400)
    assert high - low > narrow[1] - narrow[0]
    assert wilson(0.0, 50)[0] == 0.0 < wilson(0.0, 50)[1], "no pass seen is not proof of zero"


def test_pass_at_1_interval_widens_when_samples_of_a_task_agree():
    from lodestar_rollout.evaluation import pass_at_1_interval

    # 40 tasks x 4 samples at pass@1 0.5: tasks all 0.5 (samples disagree within every task) against tasks
    # all 0 or 1 (the 4 samples of a task agree: effectively 40 draws, not 160).
    mixed = pass_at_1_interval([0.5] * 40, samples=160)
    clustered = pass_at_1_interval([0.0] * 20 + [1.0] * 20, samples=160)
    assert clustered[1] - clustered[0] > 1.8 * (mixed[1] - mixed[0])
    assert clustered[0] < 0.5 < clustered[1]


def test_score_reports_the_interval_and_the_policy_versions_sampled():
    def group(task_id: str, rewards: list[float], version: int) -> rollout_pb2.Group:
        sessions = [
            rollout_pb2.SessionResult(
                reward=r,
                outcome=rollout_pb2.SESSION_OUTCOME_SCORED,
                calls=[common_pb2.CallRecord(policy_version=version)],
            )
            for r in rewards
        ]
        return rollout_pb2.Group(task_id=task_id, sessions=sessions)

    groups = [group(f"t{i}", [1.0, 0.0], version=7) for i in range(30)]

    result = score("command", "run-1", [f"t{i}" for i in range(30)], groups, k=2, pass_threshold=1.0)

    assert result.pass_at_1_low < 0.5 < result.pass_at_1_high
    assert result.policy_versions == [7]
