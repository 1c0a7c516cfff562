"""Reward and throughput curves of a run directory as PNG files (matplotlib, Agg backend: no display).

`plot_run(run_dir)` reads `<run_dir>/metrics.jsonl` and writes
- `reward.png`: reward mean (with a +-std band) and pass rate per step (when the last step has one: runs
  whose verifier gives partial credit log none); with an `eval.json` in the run directory (`lodestar train`'s
  `[eval]`), the held-out pass@1 of the starting and the final policy with their 95% intervals, at step 0
  and at the last step;
- `throughput.png`: tokens trained per second of forward/backward and the merge ratio per step, with the
  step time split into build / forward-backward / optimizer / weight push.
A resumed run appends to the same file; a step logged twice (a run resumed from an older checkpoint) is
drawn from its last record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lodestar.errors import InvalidArgumentError
from lodestar_trainer.metrics import METRICS_FILE, StepRecord, read_metrics

TIME_PARTS = ("time_build", "time_forward_backward", "time_optimizer", "time_push")


def _records(run_dir: Path) -> list[StepRecord]:
    if not (run_dir / METRICS_FILE).is_file():
        raise InvalidArgumentError(f"{run_dir} has no {METRICS_FILE} (is it a trainer --run-dir?)")
    by_step = {record.step: record for record in read_metrics(run_dir)}
    if not by_step:
        raise InvalidArgumentError(f"{run_dir / METRICS_FILE} holds no steps yet")
    return [by_step[step] for step in sorted(by_step)]


def _series(records: list[StepRecord], name: str) -> list[float]:
    return [record.values.get(name, 0.0) for record in records]


def _heldout(axes: Any, run_dir: Path) -> None:
    """The held-out pass@1 points of `<run_dir>/eval.json` (before: step 0, after: its step), if any."""
    path = run_dir / "eval.json"
    if not path.is_file():
        return
    scores = json.loads(path.read_text())
    points = [(0, scores.get("before")), (int(scores.get("after_step", 0)), scores.get("after"))]
    points = [(step, s) for step, s in points if s]
    if not points:
        return
    steps = [step for step, _ in points]
    values = [s["pass_at_1"] for _, s in points]
    errors = [
        [s["pass_at_1"] - s["pass_at_1_low"] for _, s in points],
        [s["pass_at_1_high"] - s["pass_at_1"] for _, s in points],
    ]
    axes.errorbar(steps, values, yerr=errors, fmt="s", color="tab:red", capsize=5, label="held-out pass@1 (95% CI)")
    for step, value in zip(steps, values, strict=True):
        axes.annotate(f"{value:.2f}", (step, value), textcoords="offset points", xytext=(8, -4), color="tab:red")


def plot_run(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write reward.png and throughput.png for `run_dir` (into `out_dir`, default the run dir)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = _records(run_dir)
    out = out_dir or run_dir
    out.mkdir(parents=True, exist_ok=True)
    steps = [record.step for record in records]

    with_pass = "pass_rate" in records[-1].values
    rows = 2 if with_pass else 1
    figure, axes = plt.subplots(rows, 1, figsize=(8, 2 + 2 * rows), sharex=True, squeeze=False)
    rewards = axes[0][0]
    mean, std = _series(records, "reward_mean"), _series(records, "reward_std")
    rewards.plot(steps, mean, marker="o", label="reward mean")
    rewards.fill_between(
        steps,
        [m - s for m, s in zip(mean, std, strict=True)],
        [m + s for m, s in zip(mean, std, strict=True)],
        alpha=0.2,
        label="+-std",
    )
    rewards.set_ylabel("reward")
    _heldout(rewards, run_dir)
    rewards.legend()
    if with_pass:
        passes = axes[1][0]
        passes.plot(steps, _series(records, "pass_rate"), marker="o", color="tab:green")
        passes.set_ylabel("pass rate")
    axes[-1][0].set_xlabel("step")
    figure.suptitle(f"{run_dir.name}: reward")
    reward_path = out / "reward.png"
    figure.savefig(reward_path, dpi=100)
    plt.close(figure)

    figure, (speed, split) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    speed.plot(steps, _series(records, "tokens_per_second"), marker="o", label="tokens trained / s (fwd+bwd)")
    speed.set_ylabel("tokens / s")
    ratio = speed.twinx()
    ratio.plot(steps, _series(records, "merge_ratio"), color="tab:orange", linestyle="--", label="merge ratio")
    ratio.set_ylabel("call tokens / tokens trained")
    speed.legend(loc="upper left")
    ratio.legend(loc="upper right")
    bottom = [0.0] * len(steps)
    for part in TIME_PARTS:
        values = _series(records, part)
        split.bar(steps, values, bottom=bottom, label=part.removeprefix("time_"))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    split.set_ylabel("seconds per step")
    split.set_xlabel("step")
    split.legend()
    figure.suptitle(f"{run_dir.name}: throughput")
    throughput_path = out / "throughput.png"
    figure.savefig(throughput_path, dpi=100)
    plt.close(figure)
    return [reward_path, throughput_path]
