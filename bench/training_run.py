"""Numbers of a finished (or running) `lodestar train` run, as markdown for docs/benchmarks.md.

    python bench/training_run.py RUN_DIR --store STORE [--run RUN_ID]

From the trainer's `RUN_DIR/metrics.jsonl`: per step the wall time between steps split into rollout (waiting
for groups: the interval minus the step's own time), train (build + forward/backward + optimizer) and weight
push, the trainer's tokens per second and the merge ratio, and the reward. From the rollout store (every
captured call of the run): sessions by outcome, calls per session, prompt and sampled tokens, and sampling
throughput (sampled tokens / the wall span in which calls were running).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
from pathlib import Path
from typing import Any

from lodestar.v1 import rollout_pb2


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _calls(store: Path, run_id: str) -> tuple[dict[str, int], list[Any]]:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    outcomes: dict[str, int] = {}
    for (outcome,) in db.execute("SELECT outcome FROM attempts WHERE session_id LIKE ?", (f"{run_id}-%",)):
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    results = [
        rollout_pb2.SessionResult.FromString(blob)
        for (blob,) in db.execute(
            "SELECT result FROM results WHERE session_id LIKE ? AND counted = 1", (f"{run_id}-%",)
        )
    ]
    return outcomes, results


def _busy_seconds(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def report(run_dir: Path, store: Path, run_id: str) -> str:
    steps = _steps(run_dir)
    lines = [
        "| step | wall s | rollout s | train s | push s | tokens trained | trainer tok/s | merge ratio | reward mean |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    previous = None
    for step in steps:
        train = step.get("time_build", 0.0) + step.get("time_forward_backward", 0.0) + step.get("time_optimizer", 0.0)
        wall = step["time"] - previous if previous is not None else float("nan")
        rollout = wall - step.get("time_step", 0.0) if previous is not None else float("nan")
        lines.append(
            f"| {step['step']} | {wall:.0f} | {rollout:.0f} | {train:.1f} | {step.get('time_push', 0.0):.2f} | "
            f"{step.get('tokens_trained', 0):.0f} | {step.get('tokens_per_second', 0.0):.0f} | "
            f"{step.get('merge_ratio', 0.0):.2f} | {step.get('reward_mean', 0.0):.3f} |"
        )
        previous = step["time"]
    outcomes, results = _calls(store, run_id)
    calls = [c for r in results for c in r.calls]
    sampled = sum(len(c.completion_token_ids) for c in calls)
    prompt = sum(len(c.prompt_token_ids) for c in calls)
    spans = [(c.started_at.ToDatetime().timestamp(), c.finished_at.ToDatetime().timestamp()) for c in calls]
    busy = _busy_seconds(spans)
    per_call = [
        len(c.completion_token_ids) / max(1e-9, stop - begin) for c, (begin, stop) in zip(calls, spans, strict=True)
    ]
    by_outcome = ", ".join(f"{outcome or 'running'} {count}" for outcome, count in sorted(outcomes.items()))
    summary = [
        "",
        "| sessions (attempts by outcome) | counted results | calls | calls/session | prompt tokens | sampled tokens | "
        "sampling tok/s (busy span) | per-call tok/s (median) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {by_outcome} | {len(results)} | {len(calls)} | "
        f"{len(calls) / max(1, len(results)):.1f} | {prompt} | {sampled} | {sampled / max(1e-9, busy):.1f} | "
        f"{statistics.median(per_call) if per_call else 0.0:.1f} |",
    ]
    return "\n".join(lines + summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--run", default=None, help="run id (default: the run directory's name)")
    args = parser.parse_args()
    print(report(args.run_dir, args.store, args.run or args.run_dir.name))


if __name__ == "__main__":
    main()
