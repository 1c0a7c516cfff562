"""Verifier of the smollm2-capitals example: does the reply name the right capital, and only it?

`score(workspace, task, final_answer)` (the `python` verifier kind, docs/nodes.md). Reward 1.0 when the final
answer names one of the task's accepted capitals (`metadata.answer`) and no other capital of capitals.py,
else 0.0 (a pass/fail verifier: the trainer's pass rate is reward 1). Names match as whole words, case and
accents folded ("The capital of Peru is Lima." passes; "Lima or Quito" does not: listing cities is the
reward hack a policy would find first). A capital whose name is in the question (Washington in "Washington
State") does not count as another one.
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from functools import cache
from pathlib import Path
from typing import Any


def fold(text: str) -> str:
    """Lower case, accents removed, runs of non-letters one space: the form names are compared in."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    letters = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " " + re.sub(r"[^a-z0-9]+", " ", letters).strip() + " "


@cache
def all_capitals() -> tuple[str, ...]:
    """Every capital name and accepted spelling in capitals.py, folded."""
    spec = importlib.util.spec_from_file_location("smollm2_capitals", Path(__file__).with_name("capitals.py"))
    if spec is None or spec.loader is None:
        raise ImportError("capitals.py not found next to verifier.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = {fold(name) for _, capital, alts in module.COUNTRIES + module.US_STATES for name in (capital, *alts)}
    return tuple(sorted(names))


def names(text: str, candidates: tuple[str, ...] | list[str]) -> bool:
    """Whether the folded `text` contains any of the folded `candidates` as whole words."""
    folded = fold(text)
    return any(candidate in folded for candidate in candidates)


def score(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    del workspace  # the answer is the reply itself
    accepted = [fold(name) for name in task["metadata"]["answer"]]
    question = fold(task["prompt"])
    others = tuple(c for c in all_capitals() if c not in accepted and c not in question)
    if names(final_answer, others):
        return 0.0
    return 1.0 if names(final_answer, accepted) else 0.0
