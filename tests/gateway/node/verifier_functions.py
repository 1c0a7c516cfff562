"""Functions for the `python` verifier tests (imported by the verifier's child process)."""

from __future__ import annotations

import json
import subprocess
import sys
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


def imports_solution(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    """1.0 when the agent's `solution.answer()` returns metadata.expected: imports the agent's module, as a
    verifier that unit-tests the agent's code does."""
    sys.path.insert(0, str(workspace))
    import solution  # type: ignore[import-not-found]  # the agent's module, in its workspace

    return 1.0 if solution.answer() == task["metadata"]["expected"] else 0.0


def runs_solution(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    """1.0 when the agent's program `solution.py` prints metadata.expected (it runs in a process of its own)."""
    done = subprocess.run(
        [sys.executable, "solution.py"], cwd=workspace, capture_output=True, text=True, timeout=30, check=False
    )
    return 1.0 if done.stdout.strip() == task["metadata"]["expected"] else 0.0


def reads_data_beside_it(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    """1.0 when the data file kept beside this module (as examples/smollm2-capitals keeps capitals.py) holds the
    task's expected answer: the verifier's run must see its module's directory."""
    data = json.loads(Path(__file__).with_name("verifier_data.json").read_text())
    return 1.0 if data["expected"] == task["metadata"]["expected"] else 0.0
