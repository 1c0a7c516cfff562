"""tests/waiting.py: the waits return the first truthy value and fail naming what was awaited."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import eventually, wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "ready", 5, interval_s=0.001, what="the count") == "ready"


def test_until_decides_which_value_ends_the_wait() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter), 5, interval_s=0.001, what="two", until=lambda n: n == 2) == 2
    with pytest.raises(AssertionError, match=r"waiting for three; last value: \(1, 1\)"):
        wait_until(lambda: (1, 1), 0.05, interval_s=0.01, what="three", until=lambda v: v == (1, 1, 1))


def test_wait_until_fails_with_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the light; last value: \[\]"):
        wait_until(list, 0.05, interval_s=0.01, what="the light")


async def test_eventually_awaits_async_predicates_and_fails_the_same_way() -> None:
    counter = itertools.count()

    async def third() -> int:
        return max(0, next(counter) - 1)

    assert await eventually(third, 5, interval_s=0.001, what="the count") == 1
    with pytest.raises(AssertionError, match="waiting for nothing; last value: None"):
        await eventually(lambda: None, 0.05, interval_s=0.01, what="nothing")
