"""MismatchTally's split of |trainer - inference| into the same-version mismatch and the stale tokens' drift."""

from __future__ import annotations

import pytest
import torch

from lodestar_trainer.data.batch import MicroBatch
from lodestar_trainer.step.mismatch import MismatchTally


def _batch(behaviour: list[float], versions: list[int], samples: list[int]) -> MicroBatch:
    count = len(behaviour)
    return MicroBatch(
        token_ids=[0] * (count + 1), parents=[-1, *range(count)], position_ids=list(range(count + 1)),
        target_tokens=[1] * count, target_samples=samples, behaviour_logprobs=behaviour, advantages=[1.0] * count,
        sequence_starts=[0], versions=versions,
    )  # fmt: skip


def test_stale_tokens_are_drift_and_the_gap_is_the_same_version_mismatch_only() -> None:
    # The trainer holds version 3: two fresh tokens off by 1e-6 and 3e-6, two of version 2 off by 1.5 and 2.5.
    tally = MismatchTally({0: "pi", 1: "pi"}, version=3)
    trainer = torch.tensor([-1.0, -2.0, -1.0, -2.0])
    tally.add(trainer, _batch([-1.000001, -2.000003, -2.5, -4.5], [3, 3, 2, 2], [0, 0, 1, 1]))

    values = tally.values()
    assert values["logprob_diff_mean"] == pytest.approx(2e-6, abs=1e-7)
    assert values["logprob_diff_max"] == pytest.approx(3e-6, abs=1e-7)
    assert values["logprob_diff_mean/pi"] == values["logprob_diff_mean"]
    assert values["policy_drift_mean"] == pytest.approx(2.0)
    assert values["policy_drift_max"] == pytest.approx(2.5)
    assert tally.above(0.1) == {}, "drift never warns"


def test_a_step_of_stale_tokens_only_has_drift_and_no_gap() -> None:
    tally = MismatchTally({0: "command"}, version=1)
    tally.add(torch.tensor([-1.0, -1.0]), _batch([-2.0, -1.5], [0, 0], [0, 0]))
    values = tally.values()
    assert "logprob_diff_mean" not in values
    assert "logprob_diff_mean/command" not in values
    assert values["policy_drift_mean"] == pytest.approx(0.75)


def test_a_fresh_mismatch_is_the_gap_and_warns() -> None:
    tally = MismatchTally({0: "a", 1: "b"}, version=1)
    tally.add(torch.tensor([-1.0, -1.0]), _batch([-1.0, -4.0], [1, 1], [0, 1]))
    values = tally.values()
    assert values["logprob_diff_mean"] == pytest.approx(1.5)
    assert values["logprob_diff_max"] == pytest.approx(3.0)
    assert "policy_drift_mean" not in values
    assert tally.above(0.1) == {"b": pytest.approx(3.0)}
