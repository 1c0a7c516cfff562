"""The quickstart verifier: partial credit for how much of the answer is "shouted".

`score(workspace, task, final_answer)` (the `python` verifier kind, docs/nodes.md) returns the fraction of
the answer's characters that are in `task.metadata.chars` (default: capital letters, digits and ASCII
punctuation), counted over at least `metadata.min_chars` (default 24) characters, so an empty or very
short answer cannot score high. The tiny model's random start writes about 0.16 of its characters from
that set (its byte-level BPE vocabulary, learnt on Python sources, has ~450 tokens made only of them and
~3,600 others), so every sample of a group scores differently and GRPO has signal from the first step;
moving probability mass onto that class of tokens raises the reward steadily.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

DEFAULT_CHARS = string.ascii_uppercase + string.digits + string.punctuation
DEFAULT_MIN_CHARS = 24


def char_fraction(answer: str, chars: str, min_chars: int) -> float:
    """Fraction of `answer`'s characters in `chars`, over max(len(answer), min_chars) characters."""
    hits = sum(1 for char in answer if char in chars)
    return hits / max(len(answer), min_chars, 1)


def score(workspace: Path, task: dict[str, Any], final_answer: str) -> float:
    metadata = task.get("metadata") or {}
    chars = str(metadata.get("chars", DEFAULT_CHARS))
    min_chars = int(metadata.get("min_chars", DEFAULT_MIN_CHARS))
    return char_fraction(final_answer, chars, min_chars)
