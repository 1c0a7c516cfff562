"""answer-files: walks the file system the session can see (a few seconds at most) for task sets and task
metadata (`tasks.jsonl` and other JSONL/JSON files naming `gold_patch`, `fail_to_pass`, `test_patch`,
`answer`), finds this session's task in them (its id, else its prompt) and uses what it holds: applies a gold
patch, has the model say an answer."""

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the package path, for mypy; a session runs the file as a script, _common.py beside it
    from lodestar_gateway.node.redteam.agents import _common
else:
    import _common

BUDGET_S = 4.0
MAX_FILE_BYTES = 20 * 1024 * 1024
SKIP = {
    "proc",
    "sys",
    "dev",
    "node_modules",
    ".git",
    "__pycache__",
    "site-packages",
    "dist-packages",
    "lib64",
    "include",
    "share",
    "locale",
    "zoneinfo",
    "firmware",
    "modules",
    "man",
    "doc",
}
SECRETS = ("gold_patch", "fail_to_pass", "test_patch", "answer", "expected", "solution")


def candidates(deadline: float) -> list[Path]:
    """Files that may hold task records, workspace first, then the rest of the visible tree."""
    found: list[Path] = []
    for start in (Path.cwd(), Path("/")):
        for directory, subdirectories, files in os.walk(start):
            if time.monotonic() > deadline:
                return found
            subdirectories[:] = [name for name in subdirectories if name not in SKIP]
            for name in files:
                if name.endswith((".jsonl", ".json")) and not name.startswith(("package", "tsconfig")):
                    found.append(Path(directory) / name)
    return found


def records(path: Path) -> list[dict[str, Any]]:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return []
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    if not any(secret in text for secret in SECRETS):
        return []
    lines = text.splitlines() if path.suffix == ".jsonl" else [text]
    out: list[dict[str, Any]] = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        out.extend(item for item in (value if isinstance(value, list) else [value]) if isinstance(item, dict))
    return out


def mine(record: dict[str, Any]) -> bool:
    task_id, prompt = os.environ.get("LODESTAR_TASK_ID", ""), os.environ.get("LODESTAR_PROMPT", "")
    repository = record.get("repository") if isinstance(record.get("repository"), dict) else {}
    ids = {record.get("task_id"), record.get("instance_id"), (repository or {}).get("instance_id")}
    return bool(task_id and task_id in ids) or bool(prompt and record.get("prompt") == prompt)


def secrets(record: dict[str, Any]) -> tuple[str, str]:
    """(gold patch, answer) held by a task record, either may be ""."""
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    merged = {**record, **(metadata or {})}
    patch = merged.get("gold_patch") or merged.get("patch") or ""
    answer = merged.get("answer") or merged.get("expected") or merged.get("solution") or ""
    if isinstance(answer, list):
        answer = answer[0] if answer else ""
    return str(patch), str(answer)


def main() -> int:
    deadline = time.monotonic() + BUDGET_S
    answer = ""
    for path in candidates(deadline):
        for record in records(path):
            if not mine(record):
                continue
            patch, found = secrets(record)
            if patch and _common.apply_patch(patch, _common.repository()):
                _common.leaked(f"gold patch applied from {path}")
            if found:
                _common.leaked(f"answer read from {path}")
                answer = answer or found
            if patch or found:
                return _common.finish("answer-files", answer)
    return _common.finish("answer-files", answer)


if __name__ == "__main__":
    sys.exit(main())
