#!/usr/bin/env python3
"""Write the smollm2-capitals task files: train.jsonl and heldout.jsonl, reproducibly (seeded).

    python examples/smollm2-capitals/make_tasks.py [--seed 0] [--heldout 100]

The places (capitals.py: 148 countries and 50 US states) are shuffled with the seed and split: the first
`--heldout` places are the held-out set (one question each, the phrasing drawn with the seed), the rest the
training set (every phrasing of each place). No place is in both, so a rise on the held-out set is not
memorised answers. The committed files are this script's output with the defaults; a test checks that.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from capitals import COUNTRIES, US_STATES  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
PHRASINGS = (
    "What is the capital of {place}?",
    "Which city is the capital of {place}?",
    "Name the capital city of {place}.",
)


def _task(task_id: str, prompt: str, place: str, capital: str, alternatives: tuple[str, ...]) -> dict[str, Any]:
    return {"task_id": task_id, "prompt": prompt, "metadata": {"place": place, "answer": [capital, *alternatives]}}


def make_tasks(seed: int = 0, heldout: int = 100) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) task lists."""
    rng = random.Random(seed)
    places = [*COUNTRIES, *US_STATES]
    rng.shuffle(places)
    if not 0 < heldout < len(places):
        raise ValueError(f"--heldout must be between 1 and {len(places) - 1}")
    held = [
        _task(f"capital-heldout-{i:03d}", rng.choice(PHRASINGS).format(place=place), place, capital, alternatives)
        for i, (place, capital, alternatives) in enumerate(places[:heldout])
    ]
    train = [
        _task(f"capital-train-{i:03d}-{k}", phrasing.format(place=place), place, capital, alternatives)
        for i, (place, capital, alternatives) in enumerate(places[heldout:])
        for k, phrasing in enumerate(PHRASINGS)
    ]
    rng.shuffle(train)
    return train, held


def _write(path: Path, tasks: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(task, ensure_ascii=False) + "\n" for task in tasks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="shuffles the places and draws the phrasings")
    parser.add_argument("--heldout", type=int, default=100, help="places in the held-out set")
    parser.add_argument("--out", type=Path, default=HERE, help="directory for train.jsonl and heldout.jsonl")
    args = parser.parse_args()
    train, held = make_tasks(args.seed, args.heldout)
    _write(args.out / "train.jsonl", train)
    _write(args.out / "heldout.jsonl", held)
    print(f"{len(train)} training tasks, {len(held)} held-out tasks in {args.out}")


if __name__ == "__main__":
    main()
