"""Fixtures of the trainer tests: the offline tiny model (built once per run) loaded fresh per test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from services.inference.tiny_model import TinyModelSpec, build


@pytest.fixture(scope="session")
def trainer_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (random Qwen3, hidden 64, 2 layers) written to a temp dir once per test run."""
    return build(tmp_path_factory.mktemp("trainer-tiny-model"), TinyModelSpec(corpus_bytes=200_000))


@pytest.fixture
def tiny_lm(trainer_model_dir: Path) -> Any:
    """A fresh fp32 copy of the tiny model (so tests may step it)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(trainer_model_dir, dtype=torch.float32)
