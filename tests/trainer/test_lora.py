"""LoRA training (lora.py, `[trainer.lora]`): adapters train and the base stays frozen; adapter checkpoints
resume exactly; the settings refuse what LoRA cannot do; the push payload is the adapter, B pre-scaled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lodestar.errors import InvalidArgumentError
from lodestar_trainer.checkpoint import ADAPTER_WEIGHTS_FILE, WEIGHTS_FILE, load_checkpoint
from lodestar_trainer.lora import (
    ADAPTER_CONFIG,
    adapter_state,
    apply_lora,
    lora_config,
    lora_layers,
    merge_into,
    push_state,
)
from lodestar_trainer.model import load_model
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.settings import LoraSettings
from lodestar_trainer.status import Phase
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN, make_group
from tests.trainer.helpers import trainer_for, trainer_settings

GROUPS = [make_group(seed) for seed in range(4)]
LORA: dict[str, Any] = {"enabled": True, "rank": 4, "alpha": 8.0}


def test_lora_trains_the_adapter_and_leaves_the_base_frozen(trainer_model_dir: Path, tmp_path: Path) -> None:
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, GROUPS[:2], steps=2, lora=LORA)
    base = {name: tensor.clone() for name, tensor in trainer.model.state_dict().items() if ".lora_" not in name}
    trained = sum(parameter.numel() for group in trainer.optimizer.param_groups for parameter in group["params"])
    assert trained == sum(tensor.numel() for tensor in adapter_state(trainer.model).values())
    trainer.run()
    assert trainer.board.snapshot().step == 2, trainer.board.snapshot().error
    after = trainer.model.state_dict()
    assert all(torch.equal(base[name], after[name]) for name in base)
    moved = [name for name, tensor in adapter_state(trainer.model).items() if ".lora_B." in name and tensor.any()]
    assert moved, "no adapter B moved off zero in two steps"


@pytest.mark.slow
def test_lora_resume_continues_bit_identically(trainer_model_dir: Path, tmp_path: Path) -> None:
    """3 steps straight == 1 step, an adapter checkpoint, a fresh trainer resumed from it (no --model: the
    adapter names its base), 2 steps; weights and step losses equal to the bit."""
    straight, _ = trainer_for(trainer_model_dir, tmp_path / "a", GROUPS, steps=3, lora=LORA)
    straight.run()
    assert straight.board.snapshot().step == 3, straight.board.snapshot().error

    first, _ = trainer_for(trainer_model_dir, tmp_path / "b", GROUPS, steps=1, checkpoint_every=1, lora=LORA)
    first.run()
    saved = Path(first.board.snapshot().last_checkpoint)
    assert (saved / ADAPTER_WEIGHTS_FILE).is_file()
    assert not (saved / WEIGHTS_FILE).exists()
    config = json.loads((saved / ADAPTER_CONFIG).read_text())
    assert (config["r"], config["base_model_name_or_path"]) == (4, str(trainer_model_dir))
    assert load_checkpoint(saved).state.step == 1

    resumed, source = trainer_for(
        trainer_model_dir, tmp_path / "b", GROUPS, steps=2, resume=saved, model=None, lora=LORA
    )
    resumed.run()
    status = resumed.board.snapshot()
    assert (status.phase, status.step) == (Phase.STOPPED, 3), status.error
    assert source.starts == [1]
    a, b = adapter_state(straight.model), adapter_state(resumed.model)
    assert [name for name in a if not torch.equal(a[name], b[name])] == []

    def losses(run: Path) -> list[float]:
        return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert losses(tmp_path / "a" / "run") == losses(tmp_path / "b" / "run")


def test_push_state_is_the_adapter_with_b_scaled(trainer_model_dir: Path) -> None:
    """What a replica adds to its base weight (B @ A of the push) is the delta the trainer's forward applies:
    the merged model's logits equal the adapted model's."""
    model = apply_lora(load_model(trainer_model_dir), LoraSettings(**LORA))
    torch.manual_seed(3)
    with torch.no_grad():
        for module in lora_layers(model).values():
            module.lora_B["default"].weight.normal_(0.0, 0.05)
    pushed = push_state(model)
    assert set(pushed) == {f"{name}.{part}.weight" for name in lora_layers(model) for part in ("lora_A", "lora_B")}
    base = load_model(trainer_model_dir)
    merged = merge_into(dict(base.state_dict()), {k: v for k, v in pushed.items()}, 1.0)
    base.load_state_dict(merged)
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    with torch.no_grad():
        assert torch.allclose(base(ids).logits, model(ids).logits, atol=1e-5)


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"rank": 0}, "rank and lora.alpha must be positive"),
        ({"dropout": 1.0}, r"lora.dropout must be in \[0, 1\)"),
        ({"target_modules": ["lm_head"]}, "cannot name lm_head"),
        ({"target_modules": []}, "target_modules is empty"),
    ],
)
def test_bad_lora_settings_are_refused(
    trainer_model_dir: Path, tmp_path: Path, lora: dict[str, Any], message: str
) -> None:
    settings = trainer_settings(run=RUN, model=trainer_model_dir, run_dir=tmp_path, lora={"enabled": True, **lora})
    with pytest.raises(InvalidArgumentError, match=message):
        create_trainer(settings, connect=False)


def test_lora_matching_no_module_is_refused(trainer_model_dir: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="target_modules"):
        apply_lora(load_model(trainer_model_dir), LoraSettings(enabled=True, target_modules=["no_such_proj"]))
    assert lora_config(LoraSettings()).r == 16


def test_lora_under_torchrun_is_refused(trainer_model_dir: Path, tmp_path: Path) -> None:
    settings = trainer_settings(run=RUN, model=trainer_model_dir, run_dir=tmp_path, lora=LORA)
    parallel = Parallel(rank=0, world=2)
    with pytest.raises(InvalidArgumentError, match="under torchrun"):
        create_trainer(settings, parallel, connect=False)


def test_lora_with_changed_only_sync_is_refused(trainer_model_dir: Path, tmp_path: Path) -> None:
    settings = trainer_settings(
        run=RUN, model=trainer_model_dir, run_dir=tmp_path, lora=LORA, weights={"changed_only": True}
    )
    with pytest.raises(InvalidArgumentError, match="changed_only does not apply"):
        create_trainer(settings, connect=False)
