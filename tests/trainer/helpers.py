"""Helpers shared by the trainer tests: a Trainer on the tiny model fed from memory, and a target's token path
through a packed micro-batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lodestar_trainer.data.batch import MicroBatch
from lodestar_trainer.loop import Trainer
from lodestar_trainer.settings import MOVED, TrainerSettings
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN, FeedSource


def trainer_for(model_dir: Path, tmp_path: Path, groups: list, **overrides: object) -> tuple[Trainer, FeedSource]:
    """A Trainer (not connected) on `model_dir` writing under `tmp_path/run`, fed `groups` by a FeedSource; the
    settings default to the small test ones, `overrides` replace any of them."""
    fields: dict[str, object] = {
        "run": RUN,
        "model": model_dir,
        "run_dir": tmp_path / "run",
        "lr": 1e-3,
        "micro_batch_tokens": 256,
    }
    fields.update(overrides)
    trainer = create_trainer(trainer_settings(**fields), connect=False)
    source = FeedSource(groups)
    trainer.source = source
    return trainer, source


def trainer_settings(**fields: Any) -> TrainerSettings:
    """TrainerSettings from the tests' flat shorthand (`lr=1e-3`): a key that lives in a section (settings.MOVED)
    goes there (`optimizer.lr`)."""
    values: dict[str, Any] = {}
    for key, value in fields.items():
        if key in MOVED:
            section, name = MOVED[key].split(".")
            values.setdefault(section, {})[name] = value
        else:
            values[key] = value
    return TrainerSettings.model_validate(values)


def target_path(batch: MicroBatch, index: int) -> tuple[int, ...]:
    """The token ids from the root of target `index`'s sequence down to the target itself."""
    path, token = [], batch.target_tokens[index]
    while token >= 0:
        path.append(batch.token_ids[token])
        token = batch.parents[token]
    return tuple(path[::-1])
