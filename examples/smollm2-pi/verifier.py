"""Verifier of the smollm2-pi example: run the task's file in the workspace and compare what it prints.

`score(workspace, task, final_answer)` (the `python` verifier kind, docs/nodes.md). `task.metadata` names
the `file` and its `expected` output (stripped). Partial credit, so that a 135M model gets a signal before
it solves anything:

| what happened | reward |
|---|---|
| the file prints the expected output | 1.0 |
| the file was created or changed and runs (exit 0), wrong output | 0.4 + 0.2 x similarity |
| the file was created or changed but fails | 0.2 |
| the file is untouched; the best code block of the final answer runs | 0.05 + 0.15 x similarity |
| the file is untouched, no code block runs, the final answer names the file | 0.02 |
| nothing of that | 0.0 |

similarity: difflib's ratio between the printed and the expected output, case-folded (a 135M model writes
`print("Hello, World!")` for "hello world": close, not equal).
"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RUN_TIMEOUT_S = 10.0
_CODE_BLOCK = re.compile(r"```[a-zA-Z]*[^\n]*\n(.*?)```", re.DOTALL)


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


def similarity(output: str, expected: str) -> float:
    return difflib.SequenceMatcher(None, output.casefold(), expected.casefold()).ratio()


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
        return 0.4 + 0.2 * similarity(_normalized(output), expected) if code == 0 else 0.2
    best = -1.0
    for block in _CODE_BLOCK.findall(final_answer)[:4]:
        with tempfile.TemporaryDirectory() as scratch:
            snippet = Path(scratch) / name
            snippet.write_text(block)
            code, output = _run(snippet, Path(scratch))
            if code == 0:
                best = max(best, similarity(_normalized(output), expected))
    if best >= 0.0:
        return round(0.05 + 0.15 * best, 4)
    return 0.02 if name in final_answer else 0.0
