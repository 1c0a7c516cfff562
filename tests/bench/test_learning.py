"""bench/learning.py's row: from a finished run directory (eval.json + metrics.jsonl) to a dated, commit-stamped
JSONL row and its markdown table, without training (the training itself is `make bench-learning`)."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import pytest

from bench import learning

WHEN = datetime.datetime(2026, 12, 6, 0, 30, tzinfo=datetime.UTC)


def _score(pass_at_1: float, low: float, high: float) -> dict[str, object]:
    return {"harness": "command", "run_id": "r", "k": 4, "tasks": 100, "unscored_tasks": 0, "samples": 400,
            "passed": int(pass_at_1 * 400), "reward_mean": pass_at_1, "pass_at_1": pass_at_1,
            "pass_at_k": min(1.0, pass_at_1 * 2), "pass_at_1_low": low, "pass_at_1_high": high,
            "policy_versions": [0]}  # fmt: skip


def _run(tmp_path: Path, *, after: tuple[float, float, float] = (0.455, 0.39, 0.52), steps: int = 37) -> Path:
    run = tmp_path / "runs" / "run-0123456789ab"
    run.mkdir(parents=True)
    evaluation = {"before": _score(0.135, 0.10, 0.18), "after": _score(*after), "after_step": steps}
    (run / "eval.json").write_text(json.dumps(evaluation))
    costs = {"groups": 4.0, "calls": 32.0, "call_tokens": 48_000.0, "target_tokens": 320.0, "tokens_trained": 2_000.0}
    lines = [
        json.dumps({"step": step, "time": 1e9 + step, "time_step": 0.5, "memory_peak_mb": 1000.0 + step, **costs})
        for step in range(1, steps + 1)
    ]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_a_row_has_both_scores_their_intervals_the_commit_and_the_date(tmp_path: Path) -> None:
    entry = learning.row(_run(tmp_path), example="smollm2-capitals", commit="c160404" + "0" * 33, dirty=False,
                         when=WHEN, wall_s=1128.0)  # fmt: skip
    assert entry["date"] == "2026-12-06T00:30:00+00:00"
    assert (entry["commit"][:7], entry["dirty"], entry["steps"]) == ("c160404", False, 37)
    assert entry["run_id"] == "run-0123456789ab"
    assert (entry["costs"]["prompt_tokens"], entry["costs"]["trained_per_group"]) == (1490.0, 500.0)
    assert "| 1,490 | 500 (12,000) | 0; " in learning.markdown([entry])
    assert "; 1,037 MB |" in learning.markdown([entry]), "the trainer's peak memory: the run's highest"
    assert entry["before"] == {"pass@1": 0.135, "low": 0.10, "high": 0.18, "k": 4, "pass@k": 0.27, "tasks": 100,
                               "samples": 400, "unscored_tasks": 0}  # fmt: skip
    assert entry["after"]["pass@1"] == 0.455
    assert (entry["change_points"], entry["intervals_apart"], entry["wall_minutes"]) == (32.0, True, 18.8)
    table = learning.markdown([entry])
    cells = "| 2026-12-06 | c160404 | smollm2-capitals | 37 | 0.135 [0.100, 0.180] | 0.455 [0.390, 0.520] | +32.0 |"
    assert cells + " yes | 0.27 -> 0.91 (k=4) | 18.8 |" in table


def test_overlapping_intervals_are_not_apart(tmp_path: Path) -> None:
    entry = learning.row(_run(tmp_path, after=(0.16, 0.12, 0.2)), example="x", commit="abc", dirty=True,
                         when=WHEN, wall_s=None)  # fmt: skip
    assert entry["intervals_apart"] is False
    assert "| abc+ |" in learning.markdown([entry]), "a dirty tree is marked"


def test_a_run_without_an_evaluation_gives_no_row(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "eval.json").unlink()
    with pytest.raises(learning.LearningError, match=r"\[eval\] table"):
        learning.row(run, example="x", commit="abc", dirty=False, when=WHEN, wall_s=None)
    assert learning.main(["--from-run", str(run), "--out", str(tmp_path / "rows.jsonl")]) == 1
    assert not (tmp_path / "rows.jsonl").exists()


def test_main_appends_a_row_stamped_with_heads_commit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results" / "learning.jsonl"
    run = _run(tmp_path)
    assert learning.main(["--from-run", str(run), "--out", str(out)]) == 0
    assert learning.main(["--from-run", str(run), "--out", str(out)]) == 0
    rows = learning.read_rows(out)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=learning.ROOT, capture_output=True, text=True).stdout
    assert [r["commit"] for r in rows] == [head.strip()] * 2
    assert rows[0]["example"] == "smollm2-capitals"
    capsys.readouterr()
    assert learning.main(["--table", "--out", str(out)]) == 0
    assert capsys.readouterr().out.count("| smollm2-capitals |") == 2


def test_the_newest_run_directory_is_this_commands(tmp_path: Path) -> None:
    run = _run(tmp_path)
    with pytest.raises(learning.LearningError, match="no run directory"):
        learning.newest_run(run.parent, run.stat().st_mtime + 60)
    assert learning.newest_run(run.parent, run.stat().st_mtime - 1) == run
