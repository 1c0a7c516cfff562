"""examples/smollm2-capitals: the committed task files are make_tasks.py's output (seeded), train and held-out
places are disjoint, and the verifier passes the right capital alone and nothing else."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-capitals"


def _make_tasks() -> ModuleType:
    sys.path.insert(0, str(EXAMPLE))
    try:
        return importlib.import_module("make_tasks")
    finally:
        sys.path.remove(str(EXAMPLE))


def _read(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (EXAMPLE / name).read_text().splitlines()]


def test_committed_task_files_are_the_generator_output_and_disjoint() -> None:
    train, held = _make_tasks().make_tasks(seed=0, heldout=100)
    assert _read("train.jsonl") == train
    assert _read("heldout.jsonl") == held
    assert len(held) >= 100
    train_places = {task["metadata"]["place"] for task in train}
    held_places = {task["metadata"]["place"] for task in held}
    assert not train_places & held_places
    assert len(train_places) + len(held_places) == 198
    assert _make_tasks().make_tasks(seed=1, heldout=100)[1] != held, "the seed draws the split"


def _score(prompt: str, answers: list[str], reply: str) -> float:
    verifier = importlib.import_module("examples.smollm2-capitals.verifier")
    result: float = verifier.score(Path("/nonexistent"), {"prompt": prompt, "metadata": {"answer": answers}}, reply)
    return result


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        ("The capital of Australia is Canberra.", 1.0),
        ("canberra", 1.0),
        ("CANBERRA!", 1.0),
        ("The capital of Australia is Sydney.", 0.0),
        ("Canberra or Wellington", 0.0),  # listing capitals: the hack a policy finds first
        ("Canberras", 0.0),  # whole words only
        ("", 0.0),
    ],
)
def test_the_verifier_passes_the_right_capital_alone(reply: str, reward: float) -> None:
    assert _score("What is the capital of Australia?", ["Canberra"], reply) == reward


def test_capitals_named_in_the_question_and_accents_do_not_count_against_the_reply() -> None:
    assert (
        _score("What is the capital of Washington State?", ["Olympia"], "Washington State's capital is Olympia.") == 1.0
    )
    assert _score("What is the capital of Colombia?", ["Bogota", "Bogotá"], "Bogotá") == 1.0
    assert _score("What is the capital of Colombia?", ["Bogota", "Bogotá"], "BOGOTA") == 1.0
