"""The dashboard's pure parts: metrics parsing, curves, failure causes; and the vendored uPlot is the pinned
npm release (scripts/vendor-uplot.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_app.dashboard import shape
from lodestar_app.dashboard.source import parse_metrics, read_metrics

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "lodestar_app" / "dashboard" / "static" / "vendor"


def test_parse_metrics_skips_partial_and_non_numeric() -> None:
    text = '{"step": 1, "loss": 0.5, "note": "x", "flag": true}\n\nnot json\n[1]\n{"loss": 2}\n{"step": 2, "loss": 0.4'
    assert parse_metrics(text) == [{"step": 1.0, "loss": 0.5}]


def test_read_metrics_refuses_paths_outside_the_runs_dir(tmp_path: Path) -> None:
    (tmp_path / "run-1").mkdir()
    (tmp_path / "run-1" / "metrics.jsonl").write_text('{"step": 1, "kl": 0.1}\n')
    assert read_metrics(tmp_path, "run-1") == [{"step": 1.0, "kl": 0.1}]
    assert read_metrics(tmp_path, "../run-1") == []
    assert read_metrics(tmp_path, "..") == []
    assert read_metrics(tmp_path, "run-2") == []
    assert read_metrics(None, "run-1") == []


def test_curves_fill_missing_values_with_null() -> None:
    records = [{"step": 1.0, "loss": 1.0}, {"step": 2.0, "loss": 0.5, "kl": 0.1}, {"step": 3.0, "kl": 0.2}]
    curves = shape.curves(records)
    assert curves["steps"] == [1, 2, 3]
    charts = {chart["title"]: chart for chart in curves["charts"]}
    assert charts["loss"]["values"] == [[1.0, 0.5, None]]
    assert charts["KL"]["values"] == [[None, 0.1, 0.2]]
    assert shape.curves([]) == {"steps": [], "charts": []}


def test_the_gap_chart_is_the_same_version_mismatch_and_drift_is_its_own_chart_by_the_staleness() -> None:
    records = [
        {"step": 1.0, "logprob_diff_mean": 3e-7, "logprob_diff_max": 1e-6, "logprob_diff_mean/pi": 3e-7,
         "staleness_mean": 0.0},
        {"step": 2.0, "policy_drift_mean": 2.1, "policy_drift_max": 7.5, "staleness_mean": 1.0},
    ]  # fmt: skip
    charts = shape.curves(records)["charts"]
    titles = [chart["title"] for chart in charts]
    gap = titles.index("logprob gap: trainer vs inference, same version (nats)")
    assert charts[gap]["series"] == ["logprob_diff_mean", "logprob_diff_max", "logprob_diff_mean/pi"]
    assert charts[gap]["values"][0] == [3e-7, None], "a step of stale tokens only has no gap"
    drift = titles.index("policy drift of stale samples (nats)")
    assert charts[drift]["values"] == [[None, 2.1], [None, 7.5]]
    assert titles[drift + 1] == "staleness (versions)"
    assert "logprob_diff_mean/pi" not in titles, "the per-harness gap is on the gap chart"


def test_failure_causes_group_by_first_line_without_ids() -> None:
    attempts = [
        rollout_pb2.FailedAttempt(session_id="s1", outcome="infra_failed", error="sandbox abc123def456 died\nlog"),
        rollout_pb2.FailedAttempt(session_id="s2", outcome="infra_failed", error="sandbox 99aa88bb77cc died"),
        rollout_pb2.FailedAttempt(session_id="s3", outcome="lost", error=""),
    ]
    assert shape.failure_causes(attempts) == [
        {"cause": "infra_failed: sandbox … died", "outcome": "infra_failed", "count": 2, "sessions": ["s1", "s2"]},
        {"cause": "lost", "outcome": "lost", "count": 1, "sessions": ["s3"]},
    ]


def test_advantages_only_for_scored_samples() -> None:
    group = rollout_pb2.GroupSummary(group_id="g", task_id="t", status=rollout_pb2.GROUP_STATUS_OPEN)
    group.sessions.add(session_id="a", status=rollout_pb2.SESSION_STATUS_SCORED, reward=1.0)
    group.sessions.add(session_id="b", status=rollout_pb2.SESSION_STATUS_SCORED, reward=0.0)
    group.sessions.add(session_id="c", status=rollout_pb2.SESSION_STATUS_RUNNING)
    (row,) = shape.group_rows([group], shape.AdvantageKind.MEAN)
    assert [sample.get("advantage") for sample in row["samples"]] == [0.5, -0.5, None]
    assert row["signal"]
    assert row["reward_mean"] == 0.5


def test_vendored_uplot_is_the_pinned_npm_release() -> None:
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["uplot"]
    assert (VENDOR / "uPlot.VERSION").read_text().strip() == pinned
    assert (VENDOR / "uPlot.LICENSE").read_text().startswith("The MIT License")
    installed = ROOT / "node_modules" / "uplot"
    if not installed.is_dir():
        pytest.skip("node_modules/uplot not installed (make node-tools): vendored copy not compared")
    assert json.loads((installed / "package.json").read_text())["version"] == pinned
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        assert (VENDOR / name).read_bytes() == (installed / "dist" / name).read_bytes(), (
            f"run make dashboard-assets ({name})"
        )
