"""Data parallelism for the training loop: one process, or N processes under `torchrun` (FSDP2 or DDP).

`Parallel.from_env()` reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK. With one process everything here
is a no-op. With several, it initialises the process group (nccl on CUDA, gloo on CPU) and:

- `wrap(model)` shards the model's base (`model.model`: embeddings, decoder layers, final norm) with FSDP2
  (`torch.distributed.fsdp.fully_shard` on each decoder layer, then on the base). FSDP2 runs on CPU with
  gloo in torch 2.13 (the distributed test runs it). The LM head stays replicated: services/trainer/lodestar_trainer/
  forward.py reads `lm_head.weight` directly (chunked log-softmax) instead of calling the head, so no
  FSDP hook could gather it; its gradient is all-reduced by hand. Tied embeddings (the head IS the
  sharded embedding) are therefore refused under FSDP2: use `mode="ddp"` for such models.
  `mode="ddp"` replicates the whole model and all-reduces every gradient by hand after the last
  backward of a step (DistributedDataParallel's hooks need its own forward, which forward.py bypasses).
- Rank 0 alone reads groups from rollout; `broadcast` hands each step's groups to every rank, so all
  ranks build the same sequences and micro-batches. `shard` gives rank r the micro-batches r, r+N, ...,
  padded so every rank runs the same number of forward/backward passes (FSDP2 gathers parameters
  collectively): a padding pass runs micro-batch 0 with weight 0.
- Gradients are averaged over ranks and the step loss is a sum over micro-batches under one global
  normalizer, so each rank scales its loss by `world`: the averaged gradient is the one-process one.
  FSDP2's gradient sync is switched off for all but the last backward of a step.
- `full_state` / `optimizer_state` gather full (unsharded) CPU state dicts, on rank 0 only, in the same
  FQN-keyed format a single process writes, so checkpoints move between 1 and N processes.
- Rank 0 pushes weights, reports versions, writes checkpoints and metrics.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from lodestar.errors import InvalidArgumentError
from lodestar.logging import get_logger
from lodestar_trainer.model import TiedHead, dedupe_tied, tied_names

T = TypeVar("T")
_log = get_logger("trainer.distributed")

Mode = Literal["fsdp2", "ddp"]
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
"""Deadline of every collective (a step waits at most this long for its slowest rank)."""


@dataclass
class Parallel:
    rank: int = 0
    world: int = 1
    mode: Mode = "fsdp2"
    device: str = "cpu"
    """Where this rank's collectives put their tensors: NCCL (CUDA) refuses CPU tensors, gloo takes them."""

    @classmethod
    def from_env(cls, *, mode: Mode = "fsdp2", device: str = "cpu") -> Parallel:
        """Join torchrun's process group when WORLD_SIZE > 1, else a single process."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        collective_device = "cpu"
        if device.startswith("cuda"):
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)  # this thread's; the training thread sets it again (loop.py)
            collective_device = f"cuda:{local}"
        if not dist.is_initialized():
            # On GPUs, NCCL for CUDA tensors and gloo for the CPU ones that state-dict gathering and
            # torch.distributed.checkpoint's planning exchange: no collective can meet the wrong backend.
            backend = "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"
            dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        return cls(rank=dist.get_rank(), world=dist.get_world_size(), mode=mode, device=collective_device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def close(self) -> None:
        """Leave the process group, after a barrier. Without it a rank aborted at exit now and then
        (`terminate called without an active exception`, exit -6, and torchrun fails the run): a gloo worker
        thread released the last collective's tensors (the stop plan's broadcast) after it completed, and
        that release needs the GIL, which a finalizing interpreter no longer hands out (core dump: the
        thread exits inside ~AsyncBroadcastWork). The barrier waits for the work before it; two-rank runs:
        1 abort in 7 to 14 before, none in 30 after."""
        if self.distributed and dist.is_initialized():
            try:
                self.barrier()
            except RuntimeError as error:  # a rank that died or left: leave anyway (c10d errors are RuntimeErrors)
                _log.warning("barrier before leaving the process group failed", error=str(error))
            dist.destroy_process_group()

    @property
    def shards(self) -> bool:
        """Whether `wrap` shards the model (FSDP2 under torchrun)."""
        return self.distributed and self.mode == "fsdp2"

    def wrap(self, model: Any, compute_dtype: torch.dtype = torch.float32) -> Any:
        """The model as trained: unchanged alone or under DDP, its base FSDP2-sharded under torchrun (with
        parameters gathered in `compute_dtype` and gradients reduced in fp32 when that is lower)."""
        if not self.shards:
            return model
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        tied = tied_names(model)
        if tied - {"lm_head.weight"}:
            raise InvalidArgumentError(f"FSDP2 cannot shard a model with these tied weights: {sorted(tied)}")
        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        base = model.model
        for layer in base.layers:
            fully_shard(layer, mp_policy=policy)
        # The base keeps its gathered parameters from its forward to its backward (what FSDP2 does for a root
        # anyway, said explicitly here): a tied head reads the gathered embedding after the forward.
        fully_shard(base, mp_policy=policy, reshard_after_forward=False)
        if tied:
            model.lm_head = TiedHead(base.embed_tokens)
        return model

    def broadcast(self, value: T | None) -> T | None:
        """Rank 0's `value` on every rank."""
        if not self.distributed:
            return value
        box: list[Any] = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=torch.device(self.device))
        result: T | None = box[0]
        return result

    def shard(self, items: Sequence[T]) -> list[tuple[T, float]]:
        """This rank's items (r, r+N, ...) with weight 1, padded with (items[0], 0.0) to the same count on
        every rank."""
        if not self.distributed:
            return [(item, 1.0) for item in items]
        mine = [(item, 1.0) for item in items[self.rank :: self.world]]
        per_rank = -(-len(items) // self.world)
        return mine + [(items[0], 0.0)] * (per_rank - len(mine))

    def collective_tensor(self, values: Sequence[float]) -> torch.Tensor:
        """`values` as a float64 tensor on this rank's collective device (`device`)."""
        return torch.tensor(list(values), dtype=torch.float64, device=self.device)

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of `values` over ranks."""
        if not self.distributed:
            return list(values)
        tensor = self.collective_tensor(values)
        dist.all_reduce(tensor)
        return [float(value) for value in tensor.cpu().tolist()]

    def max(self, values: Sequence[float]) -> list[float]:
        if not self.distributed:
            return list(values)
        tensor = self.collective_tensor(values)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [float(value) for value in tensor.cpu().tolist()]

    def barrier(self) -> None:
        if self.distributed:
            device = torch.device(self.device)
            dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()

    def set_grad_sync(self, model: Any, enabled: bool) -> None:
        """Let FSDP2 reduce gradients in the next backward only when `enabled` (the last of a step)."""
        if self.shards:
            model.model.set_requires_gradient_sync(enabled)

    def reduce_replicated_grads(self, model: Any) -> None:
        """Average the gradients FSDP2 does not own (all of them under DDP) over ranks, in one flat buffer."""
        if not self.distributed:
            return
        from torch.distributed.tensor import DTensor

        grads = [
            param.grad for param in model.parameters() if param.grad is not None and not isinstance(param.grad, DTensor)
        ]
        if not grads:
            return
        flat = torch.cat([grad.reshape(-1).float() for grad in grads]).to(self.device)
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for grad in grads:
            count = grad.numel()
            grad.copy_(flat[offset : offset + count].view_as(grad))
            offset += count

    def clip_grad_norm(self, model: Any, max_norm: float) -> float:
        """Scale the gradients so their global L2 norm is at most `max_norm` (<= 0: no clipping); returns the
        norm before clipping. Works on a mix of FSDP2-sharded (DTensor) and replicated gradients, which
        torch.nn.utils.clip_grad_norm_ refuses."""
        from torch.distributed.tensor import DTensor

        grads = [param.grad for param in model.parameters() if param.grad is not None]
        local = [grad.to_local() if isinstance(grad, DTensor) else grad for grad in grads]
        sharded = sum(
            (float(g.float().pow(2).sum()) for g, grad in zip(local, grads, strict=True) if isinstance(grad, DTensor)),
            0.0,
        )
        replicated = sum(
            (
                float(g.float().pow(2).sum())
                for g, grad in zip(local, grads, strict=True)
                if not isinstance(grad, DTensor)
            ),
            0.0,
        )
        (sharded,) = self.sum([sharded])
        total = math.sqrt(sharded + replicated)
        if max_norm > 0 and total > max_norm:
            scale = max_norm / (total + 1e-6)
            for grad in local:
                grad.mul_(scale)
        return total

    def full_state(self, model: Any) -> dict[str, torch.Tensor]:
        """Full CPU weights (tied ones once) on rank 0; an empty dict elsewhere. Collective."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
        if not self.is_main:
            return {}
        return dedupe_tied(
            model, {name: tensor.contiguous() for name, tensor in state.items() if isinstance(tensor, torch.Tensor)}
        )

    def optimizer_state(self, model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Full FQN-keyed optimizer state on rank 0 (empty elsewhere). Collective."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer, options=options))
        return state if self.is_main else {}

    def load_optimizer_state(self, model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a full optimizer state read on every rank (checkpoints are on a shared path)."""
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=options)

    def training_state(self, model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Model and optimizer state as this rank holds it (its FSDP2 shards; plain tensors when replicated),
        FQN-keyed, tied aliases left out: what torch.distributed.checkpoint writes and reads in place."""
        weights, optim = get_state_dict(model, optimizer)
        tied = tied_names(model)
        return {"model": {name: value for name, value in weights.items() if name not in tied}, "optim": optim}

    def load_training_state(self, model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Apply a `training_state` that torch.distributed.checkpoint filled (tied aliases share the weight)."""
        weights = {**state["model"], **{name: model.get_input_embeddings().weight for name in tied_names(model)}}
        set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=state["optim"])
