"""The chaos run's task (bench/chaos_task.py): the quickstart's score step with the capping coin, run by bash as
the command verifier runs it, and the spec's tasks copied under new ids."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from bench.chaos_task import CAP, COPIES, capped_score, chaos_spec
from lodestar_rollout.spec import load_spec_file, validate_spec

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "run.yaml"


def _score(step: str, answer: str, tmp_path: Path, runs: int) -> Counter[float]:
    reward_file = tmp_path / "reward"
    env = {**os.environ, "LODESTAR_FINAL_ANSWER": answer, "LODESTAR_REWARD_FILE": str(reward_file)}
    found: Counter[float] = Counter()
    for _ in range(runs):
        subprocess.run(["bash", "-c", step], env=env, check=True, timeout=30)
        found[float(reward_file.read_text())] += 1
    return found


def test_the_coin_caps_about_one_score_in_four(tmp_path: Path) -> None:
    step = capped_score(load_spec_file(QUICKSTART).verifier.config.fields["score"].string_value)
    found = _score(step, "SHOUT!THE-SEA-IS-100%-LOUD!!", tmp_path, runs=80)
    assert set(found) == {1.0, CAP}, found
    assert 8 <= found[CAP] <= 36, found  # 1 in 4 of 80: 20 expected, outside this 1e-4 likely
    low = _score(step, "shout! the sea is loud", tmp_path, runs=20)  # 1 of 24 counted characters: below the cap
    assert set(low) == {round(1 / 24, 6)}, low


def test_the_spec_keeps_the_quickstart_and_copies_its_tasks() -> None:
    quickstart = load_spec_file(QUICKSTART)
    spec = chaos_spec(quickstart)
    validate_spec(spec)
    assert len(spec.tasks) == COPIES * len(quickstart.tasks)
    assert len({t.task_id for t in spec.tasks}) == len(spec.tasks)
    assert [t.prompt for t in spec.tasks[: len(quickstart.tasks)]] == [t.prompt for t in quickstart.tasks]
    assert spec.harness == quickstart.harness
    assert spec.group_size == quickstart.group_size


def test_a_changed_quickstart_score_is_refused() -> None:
    with pytest.raises(ValueError, match="changed"):
        capped_score("echo 1 > $LODESTAR_REWARD_FILE")
