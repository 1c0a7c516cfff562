"""Waiting in tests: poll a condition until it holds or a deadline passes, never a fixed sleep.

`wait_until` (plain code) and `eventually` (async code) call `predicate` every `interval_s` until it returns a
truthy value (or one that `until` accepts), and return that value; past `timeout_s` they fail with an
AssertionError that names `what` was awaited and the last value the predicate returned. The predicate is
called once more at the deadline, so a slow machine gets the whole timeout. An exception raised by the
predicate propagates at once.

A sleep that is the behaviour under test (a lease outliving its TTL, a slow stand-in) stays a sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

T = TypeVar("T")


def _timed_out(what: str, timeout_s: float, last: object) -> AssertionError:
    return AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last value: {last!r}")


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    what: str,
    until: Callable[[T], object] = bool,
) -> T:
    """Call `predicate` until `until(value)` holds (default: the value is truthy) and return the value; fail
    naming `what` and the last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        last_try = time.monotonic() >= deadline
        value = predicate()
        if until(value):
            return value
        if last_try:
            raise _timed_out(what, timeout_s, value)
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))


async def eventually(
    predicate: Callable[[], T | Awaitable[T]],
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    what: str,
    until: Callable[[T], object] = bool,
) -> T:
    """The async `wait_until`: `predicate` may be a plain function or return an awaitable (an async one)."""
    deadline = time.monotonic() + timeout_s
    while True:
        last_try = time.monotonic() >= deadline
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if until(cast(T, value)):
            return cast(T, value)
        if last_try:
            raise _timed_out(what, timeout_s, value)
        await asyncio.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))
