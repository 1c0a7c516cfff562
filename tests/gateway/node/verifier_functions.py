"""Functions for the `python` verifier tests (imported by the verifier's child process)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def crash(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    return 1 / 0


def hang(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    time.sleep(300)
    return 1.0


def file_matches_answer(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    """1.0 when workspace/out.txt holds metadata.expected and the answer is "done"; 0.5 for the file alone."""
    content = (workspace / "out.txt").read_text().strip() if (workspace / "out.txt").exists() else ""
    if content != task["metadata"]["expected"]:
        return 0.0
    return 1.0 if final_answer == "done" else 0.5


def not_a_number(workspace: Path, task: dict[str, Any], final_answer: str) -> Any:
    return "high"
