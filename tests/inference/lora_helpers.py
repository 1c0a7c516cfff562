"""Helpers of the adapter-push tests: a tiny model with a trained-looking LoRA adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lodestar_trainer.lora import apply_lora, lora_layers
from lodestar_trainer.model import load_model
from lodestar_trainer.settings import LoraSettings

LORA = LoraSettings(enabled=True, rank=8, alpha=16.0)
"""The adapter the push tests train on."""


def adapted(model_dir: Path, seed: int) -> Any:
    """The tiny model with a LoRA adapter whose B is random (a trained adapter: the output differs from base)."""
    model = apply_lora(load_model(model_dir), LORA)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in lora_layers(model).values():
            weight = module.lora_B["default"].weight
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.05)
    return model.eval()


def write_adapters(model_dir: Path, out: Path, seeds: tuple[int, ...] = (1, 2)) -> tuple[list[Any], list[Path]]:
    """One adapted model per seed and its pushed adapter (`push_state`) as `out/adapter-SEED.safetensors`."""
    from safetensors.torch import save_file

    from lodestar_trainer.lora import push_state

    models, files = [], []
    for seed in seeds:
        models.append(adapted(model_dir, seed))
        files.append(out / f"adapter-{seed}.safetensors")
        save_file(push_state(models[-1]), str(files[-1]))
    return models, files
