"""bench/chaos_checks.py's reward check: the chaos run's rewards must rise as the quickstart's do, taking off (a
step at 0.8 or more) no later than the quickstart's latest take-off, step 15; a run too short to know says n/a."""

from __future__ import annotations

from bench.chaos_checks import MIN_STEPS_FOR_REWARD, reward_rises

FLAT = [0.12, 0.16, 0.14, 0.14, 0.07, 0.04, 0.04, 0.13, 0.15, 0.25, 0.48, 0.65]
"""The 12-minute run's first steps (bench/results/chaos-3.json, seed 3): take-off at step 13."""


def test_a_take_off_within_the_quickstarts_steps_passes() -> None:
    check = reward_rises([*FLAT, 0.93, 0.95, 0.91, 0.96, 0.93])
    assert check.ok, check.found
    assert check.judged
    assert "take-off (0.8) at step 13 (the quickstart's: steps 4-15)" in check.found


def test_a_late_take_off_or_none_fails() -> None:
    late = reward_rises([*FLAT, *FLAT[6:], 0.93, 0.95, 0.96])
    assert not late.ok
    assert "take-off (0.8) at step 19" in late.found
    never = reward_rises([*FLAT, 0.7, 0.75, 0.7, 0.72, 0.7])
    assert not never.ok
    assert "never at 0.8" in never.found


def test_a_run_too_short_to_know_is_not_judged() -> None:
    check = reward_rises(FLAT[: MIN_STEPS_FOR_REWARD - 1])
    assert not check.judged
    assert check.ok
