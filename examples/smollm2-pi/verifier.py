"""Verifier of the smollm2-pi example: run the task's file in the workspace and compare what it prints.

`score(workspace, task, final_answer)` (the `python` verifier kind, docs/nodes.md). `task.metadata` names
the `file` and its `expected` output (stripped). Partial credit, so that a 135M model gets a signal before
it solves anything:

| what happened | reward |
|---|---|
| the file prints the expected output | 1.0 |
| the file was created or changed and runs (exit 0), wrong output | 0.4 |
| the file was created or changed but fails | 0.2 |
| the file is untouched, but the final answer holds a code block that prints the expected output | 0.15 |
| the file is untouched, the final answer names the file | 0.05 |
| nothing of that | 0.0 |
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RUN_TIMEOUT_S = 10.0
_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def _run(path: Path, cwd: Path) -> tuple[int, str]:
    """Exit code and stripped stdout of `python path` (-1 on a timeout)."""
    try:
        done = subprocess.run(
            [sys.executable, str(path)], cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return -1, ""
    return done.returncode, done.stdout.strip()


def _normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def score(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    metadata = task.get("metadata") or {}
    name = str(metadata["file"])
    expected = _normalized(str(metadata["expected"]))
    path = workspace / name
    original = (task.get("files") or {}).get(name)
    if path.is_file() and path.read_text(errors="replace") != original:
        code, output = _run(path, workspace)
        if code == 0 and _normalized(output) == expected:
            return 1.0
        return 0.4 if code == 0 else 0.2
    for block in _CODE_BLOCK.findall(final_answer):
        with tempfile.TemporaryDirectory() as scratch:
            snippet = Path(scratch) / name
            snippet.write_text(block)
            code, output = _run(snippet, Path(scratch))
            if code == 0 and _normalized(output) == expected:
                return 0.15
    return 0.05 if name in final_answer else 0.0
