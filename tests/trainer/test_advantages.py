"""Group-relative advantages: the three forms, groups without signal, bad input."""

from __future__ import annotations

import math

import pytest

from lodestar_trainer.step.advantages import AdvantageKind, group_advantages, has_signal


def test_zscore_is_mean_zero_unit_std() -> None:
    advantages = group_advantages([1.0, 0.0, 0.0, 1.0, 1.0], AdvantageKind.ZSCORE)
    mean = sum(advantages) / len(advantages)
    std = math.sqrt(sum((a - mean) ** 2 for a in advantages) / len(advantages))
    assert mean == pytest.approx(0.0, abs=1e-9)
    assert std == pytest.approx(1.0, abs=1e-5)
    assert advantages[0] > 0 > advantages[1]


def test_mean_subtracts_the_group_mean_only() -> None:
    assert group_advantages([1.0, 0.0, 0.5, 0.5], AdvantageKind.MEAN) == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_leave_one_out_uses_the_other_samples() -> None:
    rewards = [1.0, 0.0, 0.0, 0.5]
    advantages = group_advantages(rewards, AdvantageKind.LEAVE_ONE_OUT)
    assert advantages[0] == pytest.approx(1.0 - 0.5 / 3)
    assert advantages[1] == pytest.approx(0.0 - 1.5 / 3)
    mean = sum(rewards) / 4
    assert advantages == pytest.approx([4 / 3 * (r - mean) for r in rewards])


@pytest.mark.parametrize("kind", list(AdvantageKind))
def test_group_without_signal_gets_zero(kind: AdvantageKind) -> None:
    assert not has_signal([0.7, 0.7, 0.7])
    assert not has_signal([1.0])
    assert group_advantages([0.7, 0.7, 0.7], kind) == [0.0, 0.0, 0.0]
    assert has_signal([0.7, 0.7, 0.8])


def test_bad_groups_raise() -> None:
    with pytest.raises(ValueError, match="at least one"):
        group_advantages([], AdvantageKind.ZSCORE)
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages([1.0, float("nan")], AdvantageKind.MEAN)
