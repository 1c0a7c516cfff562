"""The `[eval]` table of `lodestar train` (lodestar_app/cli/train_config.py, lodestar_app/cli/train_eval.py): parsing,
the held-out run spec built from the training spec, and the before/after verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_app.cli import train_eval
from lodestar_app.cli.train_config import EvalConfig, load_train_config
from lodestar_rollout.evaluation import HarnessScore
from lodestar_rollout.spec import load_spec_file
from lodestar_trainer.plot import plot_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-capitals"


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sub" / "train.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[train]\nspec = "run.yaml"\nsteps = 3\n' + body)
    return path


def test_eval_table_paths_are_relative_to_the_config_and_defaults_apply(tmp_path: Path) -> None:
    config = load_train_config(_write(tmp_path, '[eval]\ntasks = "held.jsonl"\n'))
    assert config.eval == EvalConfig(tasks=tmp_path / "sub" / "held.jsonl")
    assert (config.eval.samples, config.eval.before, config.eval.pass_threshold) == (4, True, 1.0)
    assert load_train_config(_write(tmp_path, "")).eval is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[eval]\nsamples = 2\n", "needs `tasks`"),
        ('[eval]\ntasks = "h.jsonl"\nsample = 2\n', "unknown [eval] keys: sample"),
        ('[eval]\ntasks = "h.jsonl"\nsamples = 0\n', "[eval] samples must be a positive integer"),
        ('[eval]\ntasks = "h.jsonl"\nbefore = "yes"\n', "[eval] before must be true or false"),
        ('[eval]\ntasks = "h.jsonl"\ntimeout_s = 0\n', "[eval] timeout_s must be positive"),
    ],
)
def test_a_bad_eval_table_is_refused_naming_the_problem(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_train_config(_write(tmp_path, body))


def test_heldout_tasks_run_like_the_training_spec() -> None:
    train = load_spec_file(EXAMPLE / "run.yaml")
    config = EvalConfig(tasks=EXAMPLE / "heldout.jsonl", samples=3)

    spec = train_eval.heldout_spec(train, config)

    assert spec.harness == train.harness
    assert spec.verifier == train.verifier
    assert spec.sampling == train.sampling
    assert (spec.group_size, spec.early_stop_fraction) == (3, 1.0)
    held = [json.loads(line)["task_id"] for line in (EXAMPLE / "heldout.jsonl").read_text().splitlines()]
    assert [task.task_id for task in spec.tasks] == held
    assert not {task.task_id for task in spec.tasks} & {task.task_id for task in train.tasks}
    assert spec.name == f"eval-command-{train.name}-heldout"


def _score(p: float, low: float, high: float, version: int) -> HarnessScore:
    return HarnessScore(
        harness="command", run_id="r", k=4, tasks=100, unscored_tasks=0, samples=400, passed=int(400 * p),
        reward_mean=p, pass_at_1=p, pass_at_k=p, pass_at_1_low=low, pass_at_1_high=high, policy_versions=[version],
    )  # fmt: skip


def test_verdict_says_whether_the_intervals_overlap() -> None:
    before = _score(0.15, 0.11, 0.19, 0)
    assert "+20.0 points" in train_eval.verdict(before, _score(0.35, 0.29, 0.41, 40))
    assert "do not overlap" in train_eval.verdict(before, _score(0.35, 0.29, 0.41, 40))
    assert "overlap: not a clear change" in train_eval.verdict(before, _score(0.2, 0.16, 0.25, 40))
    assert train_eval.verdict(None, _score(0.2, 0.16, 0.25, 40)) == ""


def test_eval_json_is_written_and_drawn_on_the_reward_plot(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [{"step": s, "policy_version": s, "time": 0.0, "reward_mean": 0.1 * s, "reward_std": 0.1} for s in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    plain = plot_run(run_dir, tmp_path / "plain")[0].read_bytes()

    path = train_eval.write(run_dir, _score(0.15, 0.11, 0.19, 0), _score(0.35, 0.29, 0.41, 2), steps=2)

    written = json.loads(path.read_text())
    assert (written["before"]["pass_at_1"], written["after"]["policy_versions"], written["after_step"]) == (
        0.15,
        [2],
        2,
    )
    assert "per_task" not in written["after"]
    assert plot_run(run_dir)[0].read_bytes() != plain, "the held-out points change the reward plot"


def test_an_eval_run_spec_file_is_used_as_it_is(tmp_path: Path) -> None:
    spec = train_eval.heldout_spec(rollout_pb2.RunSpec(), EvalConfig(tasks=EXAMPLE / "run.yaml", samples=2))
    assert spec.harness.kind == "command"
    assert len(spec.tasks) == len((EXAMPLE / "train.jsonl").read_text().splitlines())


def test_eval_against_an_unreachable_rollout_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from lodestar_app.cli.main import main
    from lodestar_app.local import free_port

    code = main(["eval", str(EXAMPLE), "--harness", "command", "--rollout", f"127.0.0.1:{free_port()}"])

    assert code == 2
    assert "lodestar: error:" in capsys.readouterr().err
