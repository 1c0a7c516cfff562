"""The policy model: load a Hugging Face causal LM directory onto a device and dtype, and read its weights.

This module and `forward.py` are where the trainer meets transformers. The model is loaded in train
mode with dropout as configured by its config (the tiny model and Qwen3 have none), so a step is a
deterministic function of weights, batch and optimizer state on CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as transformers_logging

from lodestar.errors import InvalidArgumentError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}

Dtype = Literal["float32", "bfloat16"]


def load_model(model_dir: Path, *, device: str = "cpu", dtype: Dtype = "float32") -> Any:
    """The causal LM in `model_dir` on `device` in `dtype`, in train mode (InvalidArgumentError if unusable)."""
    if not (model_dir / "config.json").is_file():
        raise InvalidArgumentError(f"model directory {model_dir} has no config.json")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidArgumentError(f"--compute.device {device} asked for, but torch sees no CUDA device")
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
    return model.to(device).train()


def enable_activation_checkpointing(model: Any) -> None:
    """Keep only each decoder layer's input in the forward and recompute the layer in the backward: activation
    memory per token drops from every layer's intermediates to one hidden state per layer, for one more forward
    of compute. Non-reentrant checkpointing, so the tree layout keyword reaches the recomputed attention."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def model_files(model_dir: Path) -> list[Path]:
    """The non-weight files of a model directory (config, tokenizer, chat template) to copy into checkpoints."""
    return sorted(
        path
        for path in model_dir.iterdir()
        if path.is_file()
        and path.suffix not in {".safetensors", ".bin", ".pt", ".gguf"}
        and not path.name.endswith(".index.json")
    )


class TiedHead(torch.nn.Module):
    """An LM head whose weight is the input embedding's, read from the embedding module at each use.

    FSDP2 replaces the embedding's registered parameter (the sharded one at rest, the gathered one from the
    base's forward to the end of its backward), so a head holding the parameter object itself would keep the
    stale pre-sharding copy. Read after the base's forward, `weight` is the gathered parameter: the head's
    gradient accumulates on it next to the embedding's own and FSDP2 reduces both together. The embedding is
    not a submodule (its parameter is owned, counted and optimized once, by the base).
    """

    bias: torch.Tensor | None = None

    def __init__(self, embedding: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_embedding", embedding)

    @property
    def weight(self) -> torch.Tensor:
        weight: torch.Tensor = object.__getattribute__(self, "_embedding").weight
        return weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden, self.weight)


def tied_names(model: Any) -> set[str]:
    """Parameter names that alias an earlier parameter (e.g. lm_head.weight tied to the embeddings)."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    unique = {name for name, _ in model.named_parameters()}
    return {name.removeprefix("module.") for name in every - unique}


def dedupe_tied(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without the tied aliases: safetensors refuses shared storage, from_pretrained re-ties them."""
    tied = tied_names(model)
    return {name: tensor for name, tensor in state.items() if name not in tied}
