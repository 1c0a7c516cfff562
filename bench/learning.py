"""Keeps the learning result true: reruns a learning example on the current tree and appends a dated,
commit-stamped row of its held-out evaluation to bench/results/learning.jsonl (`make bench-learning`).

    python bench/learning.py [--config TOML] [--run-dir DIR] [--steps N] [--out JSONL]
    python bench/learning.py --from-run RUN_DIR [--out JSONL]     # a row of a finished run, no training
    python bench/learning.py --table [--out JSONL]                # the rows as a markdown table

The default example is examples/smollm2-capitals (needs `make vllm-venv` and the SmolLM2 import:
docs/smollm2-capitals.md). `lodestar train` writes `<run dir>/<run id>/eval.json` (the [eval] table: held-out
pass@1 with its 95% interval and pass@k, before the first step and after the last) and metrics.jsonl; the row
takes both, with the commit (and whether the tree had uncommitted changes), the date, the wall minutes of the
command and the machine's CPU count. A config without an [eval] table gives no row: an error says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lodestar_app.cli import train_view

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "examples" / "smollm2-capitals" / "smollm2-capitals.toml"
DEFAULT_OUT = ROOT / "bench" / "results" / "learning.jsonl"
DEFAULT_RUN_DIR = ROOT / "runs" / "bench-learning"
TIMEOUT_S = 2 * 3600
"""The whole `lodestar train` command must end within this (the capitals example takes ~20 minutes here)."""

Row = dict[str, Any]


class LearningError(Exception):
    """A run that gives no row (no evaluation, a failed command)."""


def commit_stamp(root: Path = ROOT) -> tuple[str, bool]:
    """(HEAD's commit, whether tracked files differ from it); ("unknown", True) outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()  # fmt: skip
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                 capture_output=True, text=True, check=True, timeout=60).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown", True
    return head, bool(changed)


def _score(document: dict[str, Any] | None) -> dict[str, Any] | None:
    if document is None:
        return None
    return {
        "pass@1": document["pass_at_1"],
        "low": document["pass_at_1_low"],
        "high": document["pass_at_1_high"],
        "k": document["k"],
        "pass@k": document["pass_at_k"],
        "tasks": document["tasks"],
        "samples": document["samples"],
        "unscored_tasks": document["unscored_tasks"],
    }


def row(run: Path, *, example: str, commit: str, dirty: bool, when: datetime.datetime,
        wall_s: float | None) -> Row:  # fmt: skip
    """The row of a finished run directory (`<run dir>/<run id>`): its eval.json and metrics.jsonl."""
    path = run / "eval.json"
    if not path.exists():
        raise LearningError(f"{path} does not exist: the config needs an [eval] table (docs/smollm2-capitals.md)")
    evaluation = json.loads(path.read_text())
    before, after = _score(evaluation.get("before")), _score(evaluation.get("after"))
    if before is None or after is None:
        raise LearningError(f"{path} lacks the evaluation before or after training: set [eval] before = true")
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        "date": when.astimezone(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "example": example,
        "run_id": run.name,
        "steps": len(steps),
        "after_step": evaluation.get("after_step"),
        "before": before,
        "after": after,
        "change_points": round((after["pass@1"] - before["pass@1"]) * 100, 1),
        "intervals_apart": after["low"] > before["high"] or after["high"] < before["low"],
        "wall_minutes": None if wall_s is None else round(wall_s / 60, 1),
        "cpus": os.cpu_count(),
        "costs": {key: round(value, 3) for key, value in dataclasses.asdict(train_view.costs(steps)).items()},
    }


def append(entry: Row, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def read_rows(out: Path) -> list[Row]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def markdown(rows: list[Row]) -> str:
    """The rows as a markdown table, oldest first."""
    lines = [
        "| date | commit | example | steps | pass@1 before [95%] | pass@1 after [95%] | change | apart | pass@k before"
        " -> after | minutes | prompt tokens/call | tokens/group trained (in calls)"
        " | s/step; push, wait; trainer peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in rows:
        before, after = entry["before"], entry["after"]
        commit = entry["commit"][:7] + ("+" if entry["dirty"] else "")
        minutes = "-" if entry["wall_minutes"] is None else f"{entry['wall_minutes']:.1f}"
        lines.append(
            f"| {entry['date'][:10]} | {commit} | {entry['example']} | {entry['steps']} "
            f"| {_interval(before)} | {_interval(after)} | {entry['change_points']:+.1f} "
            f"| {'yes' if entry['intervals_apart'] else 'no'} "
            f"| {before['pass@k']:.2f} -> {after['pass@k']:.2f} (k={before['k']}) | {minutes} | {_costs(entry)} |"
        )
    return "\n".join(lines)


def _costs(entry: Row) -> str:
    """Prompt tokens per call | tokens per group | time per step, shares and the trainer's peak memory (rows from
    before the costs: dashes; from before the memory metric: no memory)."""
    found = entry.get("costs")
    if not found:
        return "- | - | -"
    return (
        f"{found['prompt_tokens']:,.0f} | {found['trained_per_group']:,.0f} ({found['calls_per_group']:,.0f}) "
        f"| {found['step_seconds']:.0f}; {found['push_share']:.0%}, {found['wait_share']:.0%}"
        + (f"; {found['memory_peak_mb']:,.0f} MB" if found.get("memory_peak_mb") else "")
    )


def _interval(score: dict[str, Any]) -> str:
    return f"{score['pass@1']:.3f} [{score['low']:.3f}, {score['high']:.3f}]"


def newest_run(run_dir: Path, since: float) -> Path:
    """The run directory `lodestar train` made under `run_dir` at or after `since` (Unix time)."""
    made = [path for path in run_dir.glob("run-*") if path.is_dir() and path.stat().st_mtime >= since]
    if not made:
        raise LearningError(f"no run directory under {run_dir} from this command")
    return max(made, key=lambda path: path.stat().st_mtime)


def train(config: Path, run_dir: Path, steps: int | None, timeout_s: float) -> tuple[Path, float]:
    """Run `lodestar train` (output streamed); the run's directory and the command's wall seconds."""
    command = [str(ROOT / ".venv" / "bin" / "lodestar"), "train", str(config), "--run-dir", str(run_dir)]
    if steps is not None:
        command += ["--steps", str(steps)]
    started = time.time()
    try:
        done = subprocess.run(command, cwd=ROOT, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise LearningError(f"`{' '.join(command)}` did not end within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise LearningError(f"`{' '.join(command)}` exited {done.returncode}")
    return newest_run(run_dir, started - 1), time.time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    parser.add_argument("--steps", type=int, default=None, help="override the example's steps (a short check)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--from-run", type=Path, default=None, help="a finished run's directory: no training")
    parser.add_argument("--table", action="store_true", help="print the rows of --out as markdown, and exit")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S)
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(read_rows(args.out)))
        return 0
    commit, dirty = commit_stamp()
    try:
        if args.from_run is not None:
            run, wall_s = args.from_run, None
        else:
            run, wall_s = train(args.config, args.run_dir, args.steps, args.timeout_s)
        entry = row(run, example=args.config.stem, commit=commit, dirty=dirty,
                    when=datetime.datetime.now(datetime.UTC), wall_s=wall_s)  # fmt: skip
    except LearningError as error:
        print(f"bench/learning.py: {error}", file=sys.stderr)
        return 1
    append(entry, args.out)
    print(markdown([entry]))
    print(f"appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
