"""Fixtures of the trainer tests: the offline tiny model (built once per run) loaded fresh per test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from lodestar_inference.tiny_model import TinyModelSpec, build


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


@pytest.fixture(scope="session")
def tied_model_dir(trainer_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with tied embeddings (the LM head is the input embedding, as in Qwen3-0.6B/1.7B/4B)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("trainer-tied-model")
    for file in trainer_model_dir.iterdir():
        if file.is_file() and file.suffix != ".safetensors":
            shutil.copy2(file, out / file.name)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(trainer_model_dir, dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(out)
    return out
