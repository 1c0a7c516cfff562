"""pass@k math of `lodestar eval` (services/rollout/evaluation.py)."""

from __future__ import annotations

from math import comb

import pytest

from lodestar.v1 import rollout_pb2
from services.rollout.evaluation import pass_at_k, score


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
