"""`lodestar train`'s ending: every step done, the run's groups used up first (a normal end that says why),
interrupted, or failed — and its exit code."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from lodestar.v1 import rollout_pb2, trainer_pb2
from lodestar_app.cli import train_view
from lodestar_app.cli.train import Ending, _report
from lodestar_app.cli.train_config import TrainConfig
from lodestar_app.cli.train_view import reward_rise

STEPS = 20


def _ended(
    tmp_path: Path,
    steps_done: int,
    *,
    run_state: int,
    error: str = "",
    interrupted: bool = False,
    untrained: int = 0,
    stop_reason: int = trainer_pb2.STOP_REASON_RUN_ENDED,
) -> tuple[int, train_view.Outcome, Ending | None, str]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with (run_dir / "metrics.jsonl").open("w") as out:
        for step in range(1, steps_done + 1):
            record = {
                "step": step,
                "policy_version": step,
                "time": 1e9 + step,
                "reward_mean": 0.1 * step,
                "merge_ratio": 1.5,
                "groups": 4,
            }
            out.write(json.dumps(record) + "\n")
    config = TrainConfig(config_path=tmp_path / "t.toml", spec=tmp_path / "run.yaml", steps=STEPS, run_dir=run_dir)
    progress = train_view.Progress(run_id="run-1", steps=STEPS)
    progress.trainer.state = trainer_pb2.TRAINER_STATE_STOPPED
    progress.trainer.untrained_groups, progress.trainer.untrained_reward_mean = untrained, 0.96875
    progress.trainer.stop_reason = stop_reason  # type: ignore[assignment]
    progress.run.state = run_state  # type: ignore[assignment]
    progress.run.groups_delivered = 4 * steps_done + 30
    progress.run.spec.tasks.add(task_id="t")
    console = Console(file=io.StringIO(), width=200)
    code, outcome, ending = _report(config, console, progress, "ckpt", error, 1.0, interrupted)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return code, outcome, ending, text


@pytest.mark.slow
def test_every_step_done_is_success(tmp_path: Path) -> None:
    code, outcome, ending, text = _ended(tmp_path, STEPS, run_state=rollout_pb2.RUN_STATE_RUNNING)
    assert (code, outcome.state, outcome.steps, ending) == (0, "done", STEPS, None)
    assert "lodestar train: done" in text  # the title shows the state


@pytest.mark.slow
def test_a_run_whose_groups_ran_out_ends_normally_and_says_why(tmp_path: Path) -> None:
    code, outcome, ending, text = _ended(tmp_path, 13, run_state=rollout_pb2.RUN_STATE_COMPLETED)
    assert (code, outcome.state) == (0, "run used up")
    assert ending is not None
    assert (ending.steps_done, ending.delivered, ending.trained, ending.no_signal) == (13, 82, 52, 30)
    assert ending.untrained_groups == 0  # the trainer read nothing after its last step
    assert outcome.note == ending.why()
    assert "read after step" not in ending.why()
    assert "after step 13" in " ".join(text.split()), text  # the summary shows it


@pytest.mark.slow
def test_a_run_used_up_mid_step_says_what_its_untrained_groups_scored(tmp_path: Path) -> None:
    code, outcome, ending, _ = _ended(tmp_path, 13, run_state=rollout_pb2.RUN_STATE_COMPLETED, untrained=25)
    assert (code, outcome.state) == (0, "run used up")
    assert ending is not None
    assert (ending.untrained_groups, ending.untrained_reward) == (25, 0.96875)


@pytest.mark.slow
def test_a_trainer_stopped_for_lack_of_signal_ends_normally_and_says_why(tmp_path: Path) -> None:
    """The trainer's stop_after_no_signal_groups: the run still has tasks, but the last groups read had no
    reward signal; `lodestar train` ends with success and names the groups and what they scored."""
    running = rollout_pb2.RUN_STATE_RUNNING
    code, outcome, ending, _ = _ended(
        tmp_path, 13, run_state=running, untrained=24, stop_reason=trainer_pb2.STOP_REASON_NO_SIGNAL
    )
    assert (code, outcome.state) == (0, "no signal left")
    assert ending is not None
    assert (ending.steps_done, ending.untrained_groups, ending.untrained_reward) == (13, 24, 0.96875)
    assert outcome.note == ending.why()


@pytest.mark.parametrize(
    ("run_state", "error", "interrupted", "title"),
    [
        (rollout_pb2.RUN_STATE_RUNNING, "", False, "stopped early"),  # the run still had groups: not used up
        (rollout_pb2.RUN_STATE_COMPLETED, "", True, "stopped early"),  # Ctrl-C
        (rollout_pb2.RUN_STATE_COMPLETED, "trainer unreachable", False, "failed"),
    ],
)
@pytest.mark.slow
def test_other_early_ends_fail(tmp_path: Path, run_state: int, error: str, interrupted: bool, title: str) -> None:
    code, outcome, ending, _ = _ended(tmp_path, 13, run_state=run_state, error=error, interrupted=interrupted)
    assert (code, outcome.state, ending) == (1, title, None)
    assert outcome.error == error


def test_the_reward_rise_compares_windows_that_never_overlap() -> None:
    steps = [0.1] * 5 + [0.5] * 5 + [0.9] * 5
    assert reward_rise(steps) == pytest.approx(0.9 - 0.1)  # 15 steps: the last 5 against the first 5
    assert reward_rise([0.1] * 5 + [0.9] * 5 + [0.5] * 2) == pytest.approx((0.9 * 2 + 0.5 * 2) / 4 - 0.1)  # thirds
    # used up right after a take-off at step 8 of 9 (a quickstart run): steps 1-3 against 7-9
    rewards = [0.167, 0.147, 0.163, 0.125, 0.118, 0.049, 0.213, 0.462, 0.986]
    assert reward_rise(rewards) == pytest.approx((0.213 + 0.462 + 0.986) / 3 - (0.167 + 0.147 + 0.163) / 3)
    # used up after 7 steps (take-off at step 4): steps 1-2 against 6-7
    rewards = [0.147, 0.104, 0.159, 0.469, 0.386, 0.986, 0.986]
    assert reward_rise(rewards) == pytest.approx(0.986 - (0.147 + 0.104) / 2)
    assert reward_rise([0.3, 0.7]) == pytest.approx(0.4)
    assert reward_rise([0.2]) == 0.0
    assert reward_rise([]) == 0.0


def test_the_trainers_mismatch_warning_is_shown_in_red(tmp_path: Path) -> None:
    outcome = train_view.Outcome(
        run_id="run-1", state="done", steps=2, run_dir=tmp_path, checkpoint="", metrics=[], plots=[], rewards=[0.1],
        merge_ratio=1.0, seconds=3.0, warning="step 2: mean |trainer - inference| logprob above 0.1 nats (pi 3.8)",
    )  # fmt: skip
    console = Console(file=io.StringIO(), width=200, force_terminal=True)
    console.print(train_view.summary(outcome))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "warning" in text
    assert "pi 3.8" in text
    assert "\x1b[1;31m" in text, "bold red"


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ("{topP: 0.95}", "top_p 0.95: the trainer recomputes temperature-only"),
        ("{mode: SAMPLING_MODE_HARNESS}", "mode HARNESS"),
    ],
)
def test_lodestar_train_refuses_a_policy_the_trainer_cannot_recompute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sampling: str, message: str
) -> None:
    from lodestar_app.cli.main import main

    (tmp_path / "run.yaml").write_text(
        "tasks: [{taskId: a}]\ngroupSize: 2\nharness: {kind: pi}\nverifier: {kind: command}\n"
        f"sampling: {sampling}\n"
    )
    config = tmp_path / "train.toml"
    config.write_text(f'[train]\nspec = "run.yaml"\nsteps = 1\nrun_dir = "{tmp_path / "runs"}"\n')
    code = main(["train", str(config)])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists(), "nothing started"


def _progress(values: dict[str, float]) -> train_view.Progress:
    progress = train_view.Progress(run_id="run-1", steps=30)
    progress.trainer.step = 7
    progress.trainer.last_metrics.values.update(values)
    return progress


def test_the_views_gap_is_the_same_version_mismatch_and_drift_is_apart() -> None:
    """A step of stale samples: the gap shown is the same-version 1.6e-5, the 2.3 nats of drift stand apart,
    next to the staleness (the old view showed the loss-wide 2.3 as the "logprob gap")."""
    values = {"logprob_diff_mean": 1.6e-5, "policy_drift_mean": 2.3, "staleness_mean": 0.94, "reward_mean": 0.5}
    line = train_view.plain_line(_progress(values))
    assert "logprob gap 1.6e-05" in line
    assert "drift 2.3 staleness 0.94" in line
    console = Console(file=io.StringIO(), width=250)
    console.print(train_view.render(_progress(values)))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    for shown in ("policy drift", "staleness", "1.6e-05", "2.3"):
        assert shown in text, shown


def test_a_step_of_stale_samples_only_shows_no_gap() -> None:
    line = train_view.plain_line(_progress({"policy_drift_mean": 2.9, "staleness_mean": 1.0}))
    assert "logprob gap -" in line
    assert "drift 2.9 staleness 1.00" in line


def test_the_summary_gives_the_runs_largest_gap_and_its_drift_apart(tmp_path: Path) -> None:
    records = [
        {"step": 1, "logprob_diff_max": 3e-7, "staleness_mean": 0.0},
        {"step": 2, "policy_drift_mean": 2.0, "staleness_mean": 1.0},
        {"step": 3, "logprob_diff_max": 1.6e-5, "policy_drift_mean": 1.0, "staleness_mean": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    gaps = train_view.run_gaps(tmp_path)
    assert gaps == train_view.Gaps(gap_max=1.6e-5, gap_steps=2, drift_mean=1.5, staleness_mean=0.5)
    outcome = train_view.Outcome(
        run_id="run-1", state="done", steps=3, run_dir=tmp_path, checkpoint="", metrics=[], plots=[],
        rewards=[0.1, 0.2, 0.3], merge_ratio=1.0, seconds=3.0, gaps=gaps,
    )  # fmt: skip
    console = Console(file=io.StringIO(), width=200)
    console.print(train_view.summary(outcome))
    text = " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]
    assert "logprob gap (max) │ 1.6e-05 nats, same-version tokens of 2 steps" in text
    assert "policy drift (mean) │ 1.5 nats on stale tokens; staleness 0.50" in text
    assert train_view.run_gaps(tmp_path / "missing") == train_view.Gaps()


def test_the_summary_gives_tokens_per_group_and_where_the_time_went() -> None:
    # Two steps of 4 groups: 10 s own time each, the second ending 30 s after the first (20 s of waiting).
    step = {"groups": 4.0, "calls": 32.0, "call_tokens": 48_000.0, "target_tokens": 320.0, "tokens_trained": 2_000.0}
    records = [
        {**step, "step": 1, "time": 1000.0, "time_step": 10.0, "time_push": 2.0, "memory_peak_mb": 900.0},
        {**step, "step": 2, "time": 1030.0, "time_step": 10.0, "time_push": 3.0, "memory_peak_mb": 1200.0},
    ]
    costs = train_view.costs(records)
    assert costs.trained_per_group == 500.0
    assert costs.calls_per_group == 12_000.0
    assert costs.prompt_tokens == (96_000 - 640) / 64
    assert costs.step_seconds == 10.0
    assert costs.push_share == pytest.approx(5 / 40)
    assert costs.wait_share == pytest.approx(20 / 40)
    assert costs.memory_peak_mb == 1200.0
    outcome = train_view.Outcome(
        run_id="run-1", state="done", steps=2, run_dir=Path("."), checkpoint="", metrics=[], plots=[],
        rewards=[0.1, 0.2], merge_ratio=24.0, seconds=40.0, costs=costs,
    )  # fmt: skip
    console = Console(file=io.StringIO(), width=200)
    console.print(train_view.summary(outcome))
    text = " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]
    assert "tokens per group │ 500 trained, 12,000 in its calls one by one (1,490 prompt tokens per call)" in text
    assert "time per step │ 10 s median; pushing 12%, waiting for groups 50%; trainer peak memory 1,200 MB" in text
    assert train_view.costs([]) == train_view.Costs()
