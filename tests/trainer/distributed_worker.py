"""One rank of the distributed tests, started by torchrun: two steps on fixed groups, then a checkpoint.

    python -m torch.distributed.run --nproc-per-node 2 tests/trainer/distributed_worker.py MODEL OUT MODE [DTYPE]

Rank 0 reads the groups (an in-memory feed) and hands them to every rank; the checkpoint (written by rank 0
from the gathered full state) is what the test compares with a one-process run, and so is the first step's
gradient as the optimizer sees it (gathered unsharded, written by rank 0 to OUT/gradients.pt).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from lodestar_trainer.loop import Trainer
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN, FeedSource, make_group
from tests.trainer.helpers import trainer_settings

GROUPS = [make_group(seed) for seed in range(4)]
SETTINGS = {"run": RUN, "lr": 1e-3, "micro_batch_tokens": 160, "groups_per_step": 2, "steps": 2, "checkpoint_every": 2}
GRADIENTS_FILE = "gradients.pt"


def capture_first_gradients(trainer: Trainer, out: Path) -> None:
    """Write the gradient of the first optimizer step (full tensors by parameter name; rank 0) to `out`."""
    step = trainer.optimizer.step
    done = False

    def capturing(*args: Any, **kwargs: Any) -> Any:
        nonlocal done
        if not done:
            done = True
            grads = {}
            for name, param in trainer.model.named_parameters():
                grad = param.grad
                if grad is not None and hasattr(grad, "full_tensor"):  # an FSDP2 shard: gathered (collective)
                    grad = grad.full_tensor()
                if grad is not None:
                    grads[name] = grad.detach().cpu().clone()
            if trainer.parallel.is_main:
                torch.save(grads, out / GRADIENTS_FILE)
        return step(*args, **kwargs)

    trainer.optimizer.step = capturing  # type: ignore[method-assign]


def main() -> int:
    model_dir, out_dir, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
    settings = trainer_settings(model=model_dir, run_dir=out_dir, parallel=mode, dtype=dtype, **SETTINGS)
    parallel = Parallel.from_env(mode=settings.compute.parallel)
    trainer = create_trainer(settings, parallel, connect=False)
    capture_first_gradients(trainer, out_dir)
    if parallel.is_main:
        trainer.source = FeedSource(GROUPS)
    trainer.run()
    status = trainer.board.snapshot()
    print(f"rank {parallel.rank}/{parallel.world}: {status.phase} step {status.step} {status.error}", flush=True)
    parallel.close()
    return 0 if status.step == 2 and not status.error else 1


if __name__ == "__main__":
    sys.exit(main())
