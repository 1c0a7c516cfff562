"""A pytest plugin that records how much of each numeric tolerance a test used (docs/testing.md, "Numerics").

Not loaded by default. `scripts`-free use, one setting per run:

    NUMERICS_SPREAD_OUT=/tmp/spread.jsonl PYTHONPYCACHEPREFIX=/tmp/spread-pyc MKL_ENABLE_INSTRUCTIONS=AVX2 \
        .venv/bin/pytest -p tests.numerics_spread -o enable_assertion_pass_hook=true tests/trainer/test_forward.py

It sees three kinds of comparison: `torch.testing.assert_close` (wrapped), `pytest.approx` (each scalar
comparison, wrapped) and a passing `assert X < bound` / `X <= bound` whose two sides are numbers (the assertion
pass hook; it needs the option above and a fresh rewrite cache, hence the PYTHONPYCACHEPREFIX). For each test it
writes one JSON line: the comparison that came closest to its bound (`used` = difference / bound), with both.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _pytest.approx import ApproxScalar

_DEFAULTS = {torch.float64: (1e-7, 1e-7), torch.float32: (1.3e-6, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
_NUMBERS = re.compile(r"^[\d.eE+\-*/() ]+$")
_COMPARISON = re.compile(r"^assert (.+?) (<=|<) (.+)$")


class _Recorder:
    def __init__(self) -> None:
        self.best: dict[str, Any] | None = None

    def add(self, kind: str, diff: float, bound: float) -> None:
        used = diff / bound if bound > 0 else (0.0 if diff == 0 else float("inf"))
        if self.best is None or used > self.best["used"]:
            self.best = {"kind": kind, "diff": diff, "bound": bound, "used": used}


_current = _Recorder()


def _wrap_assert_close(original: Callable[..., None]) -> Callable[..., None]:
    def assert_close(actual: Any, expected: Any, *args: Any, **kwargs: Any) -> None:
        original(actual, expected, *args, **kwargs)
        if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
            return
        got, want = actual.detach().double(), expected.detach().double()
        rtol, atol = kwargs.get("rtol"), kwargs.get("atol")
        if rtol is None or atol is None:
            rtol, atol = _DEFAULTS.get(expected.dtype, (0.0, 0.0))
        if got.numel() == 0:
            return
        diff = (got - want).abs()
        bound = atol + rtol * want.abs()
        index = int(torch.argmax(diff / bound.clamp_min(1e-300)))
        _current.add("assert_close", float(diff.flatten()[index]), float(bound.flatten()[index]))

    return assert_close


def _wrap_approx(original: Callable[[ApproxScalar[Any], Any], bool]) -> Callable[[ApproxScalar[Any], Any], bool]:
    def __eq__(self: ApproxScalar[Any], actual: Any) -> bool:
        equal = original(self, actual)
        with contextlib.suppress(TypeError, ValueError):
            _current.add("approx", abs(float(self.expected) - float(actual)), float(self.tolerance))
        return equal

    return __eq__


def _number(text: str) -> float | None:
    text = text.strip()
    if not _NUMBERS.match(text):
        return None
    try:
        return float(eval(text, {"__builtins__": {}}))  # digits and arithmetic only (matched above)
    except (SyntaxError, ZeroDivisionError, TypeError):
        return None


def pytest_assertion_pass(item: pytest.Item, lineno: int, orig: str, expl: str) -> None:
    found = _COMPARISON.match("assert " + expl.splitlines()[0]) if expl else None
    if found is None:
        return
    left, right = _number(found.group(1)), _number(found.group(3))
    if left is not None and right is not None and 0 < right < 1 and left >= 0:
        _current.add(f"assert line {lineno}", left, right)


@pytest.fixture(autouse=True)
def _numerics_spread(request: pytest.FixtureRequest) -> Iterator[None]:
    global _current
    _current = _Recorder()
    yield
    out = os.environ.get("NUMERICS_SPREAD_OUT")
    if out and _current.best is not None:
        with open(out, "a") as handle:
            handle.write(json.dumps({"test": request.node.nodeid, **_current.best}) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    torch.testing.assert_close = _wrap_assert_close(torch.testing.assert_close)
    ApproxScalar.__eq__ = _wrap_approx(ApproxScalar.__eq__)  # type: ignore[method-assign]
