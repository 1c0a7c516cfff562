"""Pure helpers of the `swe` verifier: the test command's argv, per-test outcomes parsed from a test runner's
output, and the reward rule (the files a test patch touches: lodestar/patches.py).

Outcome parsers (`parser` in the verifier config):

- `pytest` — `-rA` summary lines `PASSED tests/x.py::test_a`, `FAILED tests/x.py::test_b - AssertionError`,
  `ERROR ...`, `XFAIL ...`, `XPASS ...`, and verbose lines `tests/x.py::test_a PASSED [ 50%]`.
- `unittest` — verbose lines `test_a (pkg.tests.TestX.test_a) ... ok` (`FAIL`, `ERROR`, `skipped ...`,
  `expected failure`, `unexpected success`); the test id is everything before ` ... `.
- `auto` (default) — both of the above.
- `exit_code` — no parsing: every requested test passed when the command exited 0, else every one failed
  (for runners that print nothing per test; coarse: one broken test fails them all).

As in SWE-bench, PASSED and XFAIL (`ok`, `expected failure`) count as passing; FAILED, ERROR, XPASS
(`unexpected success`), SKIPPED and a test that does not appear in the output at all ("missing") do not.
When one test id is reported twice (a test that passed and then errored in teardown), a failure wins.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PARSERS = ("auto", "pytest", "unittest", "exit_code")
TESTS_PLACEHOLDER = "{tests}"
PASSING = frozenset({"passed", "xfail"})

_PYTEST_STATUS = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "XFAIL": "xfail",
    "XPASS": "xpass",
    "SKIPPED": "skipped",
}
_PYTEST_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (.+)$")
_PYTEST_VERBOSE = re.compile(r"^(\S.*?::.*?) (PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)(?: +\[ *\d+%\])?$")
_UNITTEST = re.compile(r"^(\S.*?) \.\.\. (ok|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)$")
_UNITTEST_STATUS = {"ok": "passed", "FAIL": "failed", "ERROR": "error", "expected failure": "xfail"}


def command_argv(command: Sequence[str], tests: Sequence[str]) -> list[str]:
    """`command` with an argument that is exactly `{tests}` replaced by the test ids (one argument each) and
    `{tests}` inside a longer argument (e.g. a `bash -c` script) by the ids shell-quoted, space-separated."""
    argv: list[str] = []
    for arg in command:
        if arg == TESTS_PLACEHOLDER:
            argv.extend(tests)
        else:
            argv.append(arg.replace(TESTS_PLACEHOLDER, " ".join(shlex.quote(test) for test in tests)))
    return argv


def parse_outcomes(output: str, parser: str) -> dict[str, str]:
    """Test id -> status (passed, failed, error, xfail, xpass, skipped) for every test the output reports."""
    outcomes: dict[str, str] = {}
    for raw in output.splitlines():
        line = raw.rstrip()
        for test, status in _line_outcomes(line, parser):
            if outcomes.get(test) not in (None, "passed", "xfail"):
                continue  # a failure reported earlier wins
            outcomes[test] = status
    return outcomes


def _line_outcomes(line: str, parser: str) -> Iterable[tuple[str, str]]:
    if parser in ("auto", "pytest"):
        summary = _PYTEST_SUMMARY.match(line)
        if summary and not summary.group(2).startswith("["):  # "SKIPPED [1] file:line" names no test id
            test = summary.group(2).split(" - ", 1)[0].strip()
            yield test, _PYTEST_STATUS[summary.group(1)]
            return
        verbose = _PYTEST_VERBOSE.match(line)
        if verbose:
            yield verbose.group(1), _PYTEST_STATUS[verbose.group(2)]
            return
    if parser in ("auto", "unittest"):
        unittest = _UNITTEST.match(line)
        if unittest:
            status = unittest.group(2)
            fallback = "skipped" if status.startswith("skipped") else "xpass"
            yield unittest.group(1), _UNITTEST_STATUS.get(status, fallback)


@dataclass(frozen=True)
class SweReport:
    fail_to_pass: dict[str, str]
    """FAIL_TO_PASS test id -> status (or "missing")."""
    pass_to_pass: dict[str, str]
    """PASS_TO_PASS test id -> status (or "missing")."""

    @property
    def resolved(self) -> bool:
        """Every FAIL_TO_PASS test passes and no PASS_TO_PASS test broke."""
        return all(status in PASSING for status in [*self.fail_to_pass.values(), *self.pass_to_pass.values()])

    def reward(self, *, partial_credit: bool) -> float:
        """1.0 when resolved, else 0.0; with partial credit, the fraction of FAIL_TO_PASS tests that pass when
        no PASS_TO_PASS test broke (else 0.0)."""
        if not partial_credit or self.resolved:
            return 1.0 if self.resolved else 0.0
        if not all(status in PASSING for status in self.pass_to_pass.values()):
            return 0.0
        passed = sum(status in PASSING for status in self.fail_to_pass.values())
        return passed / len(self.fail_to_pass) if self.fail_to_pass else 1.0


def report(outcomes: dict[str, str], fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]) -> SweReport:
    return SweReport(
        fail_to_pass={test: outcomes.get(test, "missing") for test in fail_to_pass},
        pass_to_pass={test: outcomes.get(test, "missing") for test in pass_to_pass},
    )


def exit_code_outcomes(tests: Sequence[str], returncode: int) -> dict[str, str]:
    """The `exit_code` parser: every test passed on exit 0, else failed."""
    return dict.fromkeys(tests, "passed" if returncode == 0 else "failed")
