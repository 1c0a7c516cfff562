"""Pure helpers of the `swe` verifier's pytest runs: which test commands are pytest runs, the argv that runs
them through the node's bootstrap (`swe_bootstrap.py`) with rootdir and config pinned to the base commit's,
and the outcomes read back from the bootstrap's report (never from the run's output).

A test command is a pytest run when, after an optional `env` with `NAME=value` assignments, it is
`python... -m pytest ARGS` or `pytest ARGS` / `py.test ARGS` (any directory). Anything else (a `bash -c`
script, Django's runner) is not, and its outcomes are parsed from its output (`swe_tests.py`).

The report is JSON lines: `started`, one `test` line per test, `collect_error` lines, and a `summary` with
the nonce the node gave, pytest's exit code, the counts and `tampered`. `read_report` checks it is whole and
consistent with itself and with the process's exit; any other shape is the agent's doing (its code runs in
that process) and scores 0, except a report without `started` (the bootstrap failed before any repository
code ran; `setup_failed`: pytest cannot be imported) and pytest's usage error (exit 4: the task's command or
test ids), which are infrastructure.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
CONFIG_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
"""pytest's configuration files, in the order it tries them in one directory."""
EMPTY_CONFIG = "[pytest]\n"
USAGE_ERROR = 4
FAILING = frozenset({"failed", "error"})


@dataclass(frozen=True)
class PytestRun:
    """A test command split around its pytest invocation."""

    prefix: list[str]
    """`env NAME=value ...` before the interpreter (kept as is), or empty."""
    python: str
    """The interpreter that runs the bootstrap (the command's own, or `python` beside a `pytest` script)."""
    args: list[str]
    """pytest's arguments."""


def pytest_run(argv: list[str]) -> PytestRun | None:
    """`argv` (test ids expanded) split as a pytest run, or None when it is not one (module docstring)."""
    start = 0
    if argv[:1] == ["env"]:
        start = 1
        while start < len(argv) and _ASSIGNMENT.match(argv[start]):
            start += 1
    prefix, rest = argv[:start], argv[start:]
    if not rest:
        return None
    program = PurePosixPath(rest[0])
    if _PYTHON.match(program.name) and rest[1:3] == ["-m", "pytest"]:
        return PytestRun(prefix, rest[0], rest[3:])
    if program.name in ("pytest", "py.test"):
        python = str(program.with_name("python")) if len(program.parts) > 1 else "python"
        return PytestRun(prefix, python, rest[1:])
    return None


def bootstrap_argv(
    run: PytestRun, bootstrap: Path, report: Path, nonce_file: Path, repo: Path, config: Path, rootdir: Path
) -> list[str]:
    """The argv that runs `run` through the bootstrap, rootdir, config and conftest search pinned (the nonce
    itself is in `nonce_file`, which the bootstrap deletes: never on the command line)."""
    pinned = ["--rootdir", str(rootdir), "-c", str(config), "--confcutdir", str(rootdir)]
    return [
        *run.prefix,
        run.python,
        "-I",
        str(bootstrap),
        str(report),
        str(nonce_file),
        str(repo),
        "--",
        *pinned,
        *run.args,
    ]


def find_config(repo: Path, tests: list[str]) -> Path | None:
    """The configuration file pytest would use in `repo` for `tests` (searched from the test files' common
    directory up to `repo`, never above it), or None. Only regular files count, never links."""
    files = [PurePosixPath(test.split("::", 1)[0]) for test in tests if "::" in test]
    common = PurePosixPath(os.path.commonpath([file.parent.as_posix() for file in files])) if files else None
    start = repo / common if common is not None and ".." not in common.parts and not common.is_absolute() else repo
    directory = start
    while True:
        for name in CONFIG_NAMES:
            candidate = directory / name
            if candidate.is_file() and not candidate.is_symlink() and _is_pytest_config(candidate):
                return candidate
        if directory == repo or repo not in directory.parents:
            return None
        directory = directory.parent


def _is_pytest_config(path: Path) -> bool:
    name = path.name
    if name in ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini"):
        return True
    text = path.read_text(errors="replace")
    if name == "pyproject.toml":
        try:
            return "pytest" in tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError:
            return False
    section = "[pytest]" if name == "tox.ini" else "[tool:pytest]"
    return any(line.strip() == section for line in text.splitlines())


@dataclass
class RunReport:
    """What the bootstrap's report says about one run."""

    outcomes: dict[str, str] = field(default_factory=dict)
    """Test id -> passed, failed, error, skipped, xfail, xpass, xfail_not_at_base."""
    error: str | None = None
    """Why the run has no trustworthy outcome (the agent's doing: reward 0)."""
    infrastructure: str | None = None
    """Why the run could not be scored at all (not the agent's doing: VerifierError)."""
    tampered: list[str] = field(default_factory=list)
    pytest_exit: int | None = None


def read_report(text: str, nonce: str, returncode: int) -> RunReport:
    """The run's outcomes from the report (module docstring), or why there are none."""
    records: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            return RunReport(error="the test report holds a line that is not JSON")
        if not isinstance(record, dict):
            return RunReport(error="the test report holds a line that is not a record")
        records.append(record)
    events = [record.get("event") for record in records]
    if "setup_failed" in events:
        why = next(record.get("error") for record in records if record.get("event") == "setup_failed")
        return RunReport(infrastructure=f"pytest could not start in the test environment: {why}")
    if "started" not in events:  # nothing of the repository has run before this line
        return RunReport(infrastructure=f"the node's bootstrap did not start pytest (exit {returncode})")
    if events.count("started") != 1 or events.count("summary") != 1 or events[-1] != "summary":
        return RunReport(error=f"the test run ended before its report was complete (exit {returncode})")
    return _checked(records, nonce, returncode)


def _checked(records: list[dict[str, Any]], nonce: str, returncode: int) -> RunReport:
    summary = records[-1]
    tests = [record for record in records if record.get("event") == "test"]
    outcomes: dict[str, str] = {}
    for record in tests:
        test, status = record.get("id"), record.get("status")
        if not isinstance(test, str) or not isinstance(status, str):
            return RunReport(error="the test report holds a malformed test line")
        if outcomes.get(test) not in FAILING:  # reported twice: a failure wins
            outcomes[test] = status
    code = summary.get("exit")
    counted = Counter(str(record.get("status")) for record in tests)
    collect_errors = sum(record.get("event") == "collect_error" for record in records)
    if summary.get("nonce") != nonce or code != returncode or summary.get("counts") != dict(counted):
        return RunReport(error=f"the test report's summary does not match the run (exit {returncode})")
    if summary.get("collect_errors") != collect_errors:
        return RunReport(error="the test report's summary does not match its collection errors")
    tampered = summary.get("tampered")
    if not isinstance(tampered, list):
        return RunReport(error="the test report's summary is malformed")
    if code == USAGE_ERROR:
        return RunReport(infrastructure="pytest refused its arguments (exit 4: the task's test command or ids)")
    failing = collect_errors or any(status in FAILING for status in counted.elements())
    if code in (0, 1) and (code == 1) != bool(failing):
        return RunReport(error=f"pytest's exit {code} contradicts its test outcomes")
    return RunReport(outcomes=outcomes, tampered=[str(name) for name in tampered], pytest_exit=code)
