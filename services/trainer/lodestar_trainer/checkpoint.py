"""Checkpoints: a loadable model directory plus everything needed to continue training exactly.

A checkpoint directory holds
- `model.safetensors` and the base model's config/tokenizer files: a Hugging Face model directory that
  `lodestar inference serve --model DIR`, `UpdateWeights(checkpoint_path=DIR)` and `--model DIR` load; with
  LoRA (`[trainer.lora]`) instead the adapter alone, `adapter_model.safetensors` and `adapter_config.json`
  in peft's format (lora.py), resumed on the base model of `--model` or of the adapter's config;
- `optimizer.pt`: the optimizer's state dict (torch.save; loaded with weights_only=True), written by one
  process; under torchrun instead `distributed/`, a torch.distributed.checkpoint of the model and optimizer
  state in which every rank wrote its own shard (services/trainer/lodestar_trainer/parallel/sharded.py);
- `rng.pt`: torch CPU (and CUDA) generator states (of rank 0; rank r > 0 writes `rng-rank<r>.pt`);
  `trainer_state.json`: step, policy version, run, groups read from rollout (the StreamGroups resume point),
  skipped steps, and Python's `random` state.

Writes are atomic: everything goes to a sibling temp directory that is renamed into place, so a crash
never leaves a half checkpoint under the final name.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lodestar.errors import InvalidArgumentError

WEIGHTS_FILE = "model.safetensors"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
"""A LoRA checkpoint's weights: the adapter alone (lora.py)."""
OPTIMIZER_FILE = "optimizer.pt"
SHARDED_DIR = "distributed"
RNG_FILE = "rng.pt"
STATE_FILE = "trainer_state.json"


@dataclass(frozen=True)
class TrainState:
    """Counters that make a resumed run continue where it stopped."""

    step: int = 0
    policy_version: int = 0
    run_id: str = ""
    groups_read: int = 0
    """Groups consumed from StreamGroups (trained, skipped or dropped): the next stream starts after them."""
    skipped_steps: int = 0


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    state: TrainState
    optimizer: dict[str, Any]
    """The full optimizer state (empty in a sharded checkpoint: it is in `sharded`)."""
    rng: dict[str, Any]
    sharded: Path | None = None
    """The torch.distributed.checkpoint directory of model and optimizer state (written under torchrun)."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def rng_file(rank: int) -> str:
    return RNG_FILE if rank == 0 else f"rng-rank{rank}.pt"


def capture_rng() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": json.dumps(random.getstate())}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = json.loads(rng["python"])
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def save_checkpoint(
    path: Path,
    *,
    weights: Mapping[str, torch.Tensor],
    optimizer: Mapping[str, Any],
    state: TrainState,
    model_files: list[Path],
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write a checkpoint to `path` atomically (replacing one already there); returns `path`. With
    `extra_files` (name -> text, a LoRA adapter's config) the weights are written as the adapter's."""
    staging = begin_checkpoint(path)
    try:
        torch.save(dict(optimizer), staging / OPTIMIZER_FILE)
        write_rng(staging, rank=0)
        for name, text in (extra_files or {}).items():
            (staging / name).write_text(text)
        weights_file = ADAPTER_WEIGHTS_FILE if extra_files else WEIGHTS_FILE
        finish_checkpoint(
            staging, path, weights=weights, state=state, model_files=model_files, weights_file=weights_file
        )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def begin_checkpoint(path: Path) -> Path:
    """A new staging directory next to `path`, where a checkpoint is written before it is renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))


def write_rng(staging: Path, *, rank: int) -> None:
    """This process's torch generator states (Python's go into trainer_state.json, from rank 0)."""
    rng = capture_rng()
    torch.save({key: value for key, value in rng.items() if key != "python"}, staging / rng_file(rank))


def finish_checkpoint(
    staging: Path,
    path: Path,
    *,
    weights: Mapping[str, torch.Tensor],
    state: TrainState,
    model_files: list[Path],
    weights_file: str = WEIGHTS_FILE,
) -> None:
    """Add the model directory (weights, config, tokenizer) and the counters to `staging`, then rename it to
    `path` (replacing a checkpoint already there). The caller removes `staging` if this raises."""
    for file in model_files:
        if not (staging / file.name).exists():  # an adapter's config written for this checkpoint stays
            shutil.copy2(file, staging / file.name)
    save_file(dict(weights), str(staging / weights_file), metadata={"format": "pt"})
    document = {**asdict(state), "python_random": json.dumps(random.getstate())}
    (staging / STATE_FILE).write_text(json.dumps(document, indent=2) + "\n")
    if path.exists():
        shutil.rmtree(path)
    staging.rename(path)


def load_checkpoint(path: Path, *, rank: int = 0) -> Checkpoint:
    """Read the training state of a checkpoint as rank `rank` resumes it (the weights are loaded as a model
    directory by model.py, and from `sharded` when there is one). A rank the checkpoint has no generator
    state for (more ranks than wrote it) takes rank 0's."""
    sharded = path / SHARDED_DIR
    optimizer_part = SHARDED_DIR if sharded.is_dir() else OPTIMIZER_FILE
    weights = ADAPTER_WEIGHTS_FILE if (path / ADAPTER_WEIGHTS_FILE).is_file() else WEIGHTS_FILE
    required = (weights, RNG_FILE, STATE_FILE)
    missing = [name for name in required if not (path / name).is_file()]
    if not (path / optimizer_part).exists():
        missing.append(f"{OPTIMIZER_FILE} or {SHARDED_DIR}/")
    if missing:
        raise InvalidArgumentError(f"{path} is not a trainer checkpoint (missing {', '.join(missing)})")
    document = json.loads((path / STATE_FILE).read_text())
    python_random = document.pop("python_random")
    state = TrainState(**document)
    optimizer: dict[str, Any] = {} if sharded.is_dir() else torch.load(path / OPTIMIZER_FILE, weights_only=True)
    own = path / rng_file(rank)
    rng: dict[str, Any] = torch.load(own if own.is_file() else path / RNG_FILE, weights_only=True)
    rng["python"] = python_random
    shards = sharded if sharded.is_dir() else None
    return Checkpoint(path=path, state=state, optimizer=optimizer, rng=rng, sharded=shards)
