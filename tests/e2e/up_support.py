"""Helpers of the `lodestar up` e2e tests (test_up, test_up_run, tests/dashboard/test_cli): start `lodestar up`
as a subprocess, read its output until a marker, parse the address table it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ADDRESS = re.compile(r"^│ (etcd|inference|rollout|gateway|trainer)\s+│ (?:http://)?127\.0\.0\.1:(\d+)", re.MULTILINE)


def up_process(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    """`lodestar up --data-dir <tmp>/up EXTRA...` with stdout and stderr merged into one text pipe."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "lodestar_app.cli.main", "up", "--data-dir", str(tmp_path / "up"), *extra],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def read_until(process: subprocess.Popen[str], marker: str, timeout: float) -> str:
    """The output up to and including the first line containing `marker` (AssertionError after `timeout`)."""
    assert process.stdout is not None
    output = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        output += line
        if marker in line:
            return output
    raise AssertionError(f"{marker!r} not seen within {timeout} s; output:\n{output}")
