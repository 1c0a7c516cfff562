"""Checkpoint and resume: N steps straight == k steps, checkpoint, a fresh trainer resumed from it, N-k steps.

Bit-identical on CPU fp32 (the tolerance is 0): the checkpoint carries the weights, the AdamW state, the
step, the policy version, the groups read from rollout (so the resumed stream starts after them) and
the RNG state.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lodestar.errors import InvalidArgumentError
from lodestar_trainer.checkpoint import load_checkpoint
from lodestar_trainer.status import Phase
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN, make_group
from tests.trainer.helpers import trainer_for, trainer_settings

GROUPS = [make_group(seed) for seed in range(4)]


@pytest.mark.slow
def test_resume_continues_bit_identically(trainer_model_dir: Path, tmp_path: Path) -> None:
    straight, _ = trainer_for(trainer_model_dir, tmp_path / "a", GROUPS, steps=3)
    straight.run()
    assert straight.board.snapshot().step == 3, straight.board.snapshot().error

    first, _ = trainer_for(trainer_model_dir, tmp_path / "b", GROUPS, steps=1, checkpoint_every=1)
    first.run()
    saved = Path(first.board.snapshot().last_checkpoint)
    assert saved.name == "step-000001"
    checkpoint = load_checkpoint(saved)
    assert (checkpoint.state.step, checkpoint.state.policy_version, checkpoint.state.groups_read) == (1, 1, 1)
    assert (saved / "config.json").is_file()
    assert (saved / "tokenizer.json").is_file()

    resumed, source = trainer_for(trainer_model_dir, tmp_path / "b", GROUPS, steps=2, resume=saved, model=None)
    assert (resumed.state.step, resumed.state.policy_version) == (1, 1)
    resumed.run()
    status = resumed.board.snapshot()
    assert (status.phase, status.step) == (Phase.STOPPED, 3), status.error
    assert source.starts == [1]

    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    mismatched = [name for name in a if not torch.equal(a[name], b[name])]
    assert not mismatched, f"weights differ after resume: {mismatched[:5]}"
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_resume_refuses_a_checkpoint_of_another_run(trainer_model_dir: Path, tmp_path: Path) -> None:
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, GROUPS[:1], steps=1, checkpoint_every=1)
    trainer.run()
    saved = Path(trainer.board.snapshot().last_checkpoint)
    settings = trainer_settings(run="run-other", resume=saved, run_dir=tmp_path / "other")
    with pytest.raises(InvalidArgumentError, match="is of run 'run-test', not 'run-other'"):
        create_trainer(settings, connect=False)
    assert RUN == "run-test"


def test_not_a_checkpoint_is_a_clear_error(tmp_path: Path, trainer_model_dir: Path) -> None:
    settings = trainer_settings(run=RUN, resume=trainer_model_dir, run_dir=tmp_path)
    with pytest.raises(InvalidArgumentError, match="is not a trainer checkpoint"):
        create_trainer(settings, connect=False)
