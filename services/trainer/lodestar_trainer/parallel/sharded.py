"""Checkpoints under torchrun: every rank writes its own shard of the training state, rank 0 the rest.

A checkpoint written by N ranks is the one-process layout (services/trainer/lodestar_trainer/checkpoint.py) with
`distributed/` in place of `optimizer.pt`:

    model.safetensors, config, tokenizer   the full fp32 weights, gathered to rank 0: what inference loads
    distributed/                           torch.distributed.checkpoint: `.metadata` and one `__<rank>_0.distcp`
                                           per rank, the model and AdamW state sharded as they were trained
    trainer_state.json, rng.pt             rank 0's counters and generator states; rank r > 0: rng-rank<r>.pt

The optimizer state (twice the model in fp32) is never gathered on one rank. Resuming reads `distributed/`
with torch.distributed.checkpoint, which reshards on load: the same number of ranks, another number, or one
process (lodestar_trainer/wiring.py). All ranks write into one staging directory (the checkpoint directory
must be on a filesystem every rank sees, as for resuming), which rank 0 renames into place once every rank
has written: a crash leaves no half checkpoint under the final name.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from lodestar.errors import InternalError
from lodestar_trainer.checkpoint import SHARDED_DIR, TrainState, begin_checkpoint, finish_checkpoint, write_rng
from lodestar_trainer.parallel.distributed import Parallel


def save_sharded(
    path: Path,
    *,
    parallel: Parallel,
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    model_files: list[Path],
) -> Path:
    """Write a checkpoint of every rank's state to `path` (collective: every rank calls it). An error on any
    rank is raised on every rank, so they stay in step."""
    weights = parallel.full_state(model)
    staging = parallel.broadcast(begin_checkpoint(path) if parallel.is_main else None)
    assert staging is not None
    failure = ""
    try:
        dcp_save(parallel.training_state(model, optimizer), checkpoint_id=staging / SHARDED_DIR)
        write_rng(staging, rank=parallel.rank)
    except Exception as error:  # reported to every rank below
        failure = f"rank {parallel.rank}: {type(error).__name__}: {error}"
    (failed,) = parallel.max([1.0 if failure else 0.0])
    if parallel.is_main:
        try:
            if failed:
                raise InternalError(failure or "another rank failed to write its shard")
            finish_checkpoint(staging, path, weights=weights, state=state, model_files=model_files)
        except Exception as error:  # reported to every rank below
            shutil.rmtree(staging, ignore_errors=True)
            failure = error.message if isinstance(error, InternalError) else f"{type(error).__name__}: {error}"
        else:
            failure = ""
    outcome = parallel.broadcast(failure if parallel.is_main else None)
    if outcome:
        raise InternalError(f"checkpoint {path} not written: {outcome}")
    return path


def load_sharded(directory: Path, *, parallel: Parallel, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Load the model and optimizer state of `directory` (a checkpoint's `distributed/`) into this rank's
    shards (collective under torchrun; one process reads it whole)."""
    state = parallel.training_state(model, optimizer)
    dcp_load(state, checkpoint_id=directory)
    parallel.load_training_state(model, optimizer, state)
