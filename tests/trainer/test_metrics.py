"""Per-step metrics: JSONL and TensorBoard event files hold the same values; `lodestar plot` draws them."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lodestar_app.cli.main import main
from lodestar_trainer.metrics import TENSORBOARD_DIR, MetricsWriter, StepRecord, read_metrics

PNG = b"\x89PNG\r\n\x1a\n"


def values(step: int) -> dict[str, float]:
    return {
        "reward_mean": 0.1 * step, "reward_std": 0.05, "pass_rate": 0.25, "tokens_per_second": 1000.0 + step,
        "merge_ratio": 2.5, "time_build": 0.01, "time_forward_backward": 0.2, "time_optimizer": 0.02,
        "time_push": 0.05, "loss": -0.01 * step,
    }  # fmt: skip


def write_run(run_dir: Path, steps: int) -> list[StepRecord]:
    writer = MetricsWriter(run_dir)
    records = [StepRecord(step, step, values(step), time=1_700_000_000.0 + step) for step in range(1, steps + 1)]
    for record in records:
        writer.write(record)
    writer.close()
    return records


def test_jsonl_and_tensorboard_hold_every_step(tmp_path: Path) -> None:
    written = write_run(tmp_path, 3)
    assert list(read_metrics(tmp_path)) == written
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    assert "train/reward_mean" in events.Tags()["scalars"]
    rewards = events.Scalars("train/reward_mean")
    assert [event.step for event in rewards] == [1, 2, 3]
    assert [round(event.value, 6) for event in rewards] == [0.1, 0.2, 0.3]
    assert [event.wall_time for event in rewards] == [record.time for record in written]


@pytest.mark.slow
def test_lodestar_plot_writes_reward_and_throughput_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "run", 4)
    assert main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "plots")]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "plots" / "reward.png"), str(tmp_path / "plots" / "throughput.png")]
    for path in printed:
        data = Path(path).read_bytes()
        assert data.startswith(PNG)
        assert len(data) > 10_000


def test_lodestar_plot_without_metrics_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
