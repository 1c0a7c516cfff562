"""Build a ready-to-run Trainer from TrainerSettings: model, optimizer, resume state, clients, metrics.

Start from `--model DIR`, or from `--resume CHECKPOINT` (weights, optimizer state, step, policy version,
groups read and RNG state; the run must match). Under torchrun only rank 0 gets the rollout and
inference clients (the replicas of --inference, or those registered in etcd) and the metrics writer. The
KL reference (kl_coef > 0) is the starting model (`--model`, else the resumed checkpoint's weights), frozen,
in the compute dtype. The trained model is always fp32; `--dtype bfloat16` sets the compute dtype
(precision.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar.etcd import tls_from_settings
from lodestar.grpc.client import split_targets
from lodestar_trainer.builders import BuilderKind
from lodestar_trainer.checkpoint import TrainState, load_checkpoint, restore_rng
from lodestar_trainer.loop import LoopConfig, Publisher, Trainer
from lodestar_trainer.metrics import MetricsWriter
from lodestar_trainer.model import DTYPES, enable_activation_checkpointing, load_model, model_files
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.parallel.sharded import load_sharded
from lodestar_trainer.planner import BatchConfig
from lodestar_trainer.rollout_client import RolloutClient
from lodestar_trainer.settings import TrainerSettings
from lodestar_trainer.status import Status, StatusBoard
from lodestar_trainer.step.advantages import AdvantageKind
from lodestar_trainer.step.loss import Aggregation, LossConfig
from lodestar_trainer.step.optimizer_step import StepConfig
from lodestar_trainer.step.precision import ComputeCopy, set_matmul_precision
from lodestar_trainer.weights.publish import FanoutPublisher, publisher_for
from lodestar_trainer.weights.replica_discovery import DiscoveredReplicas
from lodestar_trainer.weights.transports import transport_publisher


def loop_config(settings: TrainerSettings) -> LoopConfig:
    if settings.run is None:
        raise FailedPreconditionError("the trainer needs --run RUN_ID")
    if settings.micro_batch_tokens <= 0 or settings.groups_per_step <= 0:
        raise InvalidArgumentError("micro_batch_tokens and groups_per_step must be positive")
    if settings.stop_after_no_signal_groups < 0:
        raise InvalidArgumentError("stop_after_no_signal_groups must be >= 0 (0: never stop for it)")
    if not settings.mismatch_warn_nats >= 0:
        raise InvalidArgumentError("mismatch_warn_nats must be >= 0 (0: never warn)")
    loss = LossConfig(
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
        aggregation=Aggregation(settings.aggregation),
        kl_coef=settings.kl_coef,
        tis_cap=settings.tis_cap,
    )
    cuda = settings.device.startswith("cuda")
    attention = settings.attention if settings.attention != "auto" else ("flex" if cuda else "explicit")
    if attention == "flex" and not cuda:
        raise InvalidArgumentError("--attention flex needs a CUDA device: flex attention has no backward on CPU")
    batch = BatchConfig(
        run_id=settings.run,
        builder=BuilderKind(settings.builder),
        advantage=AdvantageKind(settings.advantage),
        micro_batch_tokens=settings.micro_batch_tokens,
        groups_per_step=settings.groups_per_step,
        max_staleness=settings.max_staleness,
        stop_after_no_signal_groups=settings.stop_after_no_signal_groups,
    )
    step = StepConfig(
        loss=loss,
        behaviour_correction=settings.behaviour_correction,
        max_grad_norm=settings.max_grad_norm,
        attention=attention,
        pass_threshold=settings.pass_threshold,
        mismatch_warn_nats=settings.mismatch_warn_nats,
    )
    return LoopConfig(
        run_id=settings.run,
        batch=batch,
        step=step,
        steps=settings.steps,
        checkpoint_every=settings.checkpoint_every,
        checkpoint_dir=settings.checkpoint_dir or settings.run_dir / "checkpoints",
        async_push=settings.async_push,
    )


def publisher_of(settings: TrainerSettings) -> Publisher | None:
    """Where weights go: `--inference` (None when empty), or every replica registered in etcd; over the
    transport of `weights_transport` (services/trainer/lodestar_trainer/weights/transports.py)."""
    options = {"timeout_s": settings.push_timeout_s, "attempts": settings.push_attempts}
    if settings.inference_discovery == "static":
        if not settings.inference:
            return None
        if settings.weights_transport != "grpc":
            return transport_publisher(settings, split_targets(settings.inference))
        return publisher_for(settings.inference, **options)
    if not settings.etcd:
        raise InvalidArgumentError("--inference-discovery etcd needs --etcd: replicas register there")
    tls = tls_from_settings(settings.etcd, settings)
    replicas = DiscoveredReplicas(settings.etcd, prefix=settings.etcd_prefix, tls=tls)
    if settings.weights_transport != "grpc":
        return transport_publisher(settings, replicas.addresses, on_close=replicas.close)
    return FanoutPublisher(replicas.addresses, on_close=replicas.close, **options)


def create_trainer(settings: TrainerSettings, parallel: Parallel | None = None, *, connect: bool = True) -> Trainer:
    """A Trainer for `settings` (FailedPreconditionError without --run and --model/--resume).

    `connect=False` leaves out the rollout and inference clients (tests drive `train_step` directly).
    """
    config = loop_config(settings)
    start = settings.resume or settings.model
    if start is None:
        raise FailedPreconditionError("the trainer needs --model DIR (or --resume CHECKPOINT)")
    parallel = parallel or Parallel.from_env(mode=settings.parallel, device=settings.device)
    checkpoint = load_checkpoint(settings.resume, rank=parallel.rank) if settings.resume else None
    if checkpoint is not None and checkpoint.state.run_id and checkpoint.state.run_id != config.run_id:
        raise InvalidArgumentError(
            f"checkpoint {settings.resume} is of run {checkpoint.state.run_id!r}, not {config.run_id!r}"
        )
    compute_dtype = DTYPES[settings.dtype]
    set_matmul_precision(settings.device, compute_dtype)
    loaded = load_model(start, device=settings.device, dtype="float32")
    checkpointing = settings.activation_checkpointing
    if checkpointing or (checkpointing is None and settings.device.startswith("cuda")):
        enable_activation_checkpointing(loaded)  # before the compute copy, which keeps it
    model = parallel.wrap(loaded, compute_dtype)
    compute = None if compute_dtype == torch.float32 or parallel.shards else ComputeCopy(model, compute_dtype)
    batch = dataclasses.replace(config.batch, vocab_size=int(model.config.vocab_size))
    config = dataclasses.replace(config, batch=batch)
    reference: Any = None
    if settings.kl_coef:
        reference = load_model(settings.model or start, device=settings.device, dtype=settings.dtype).eval()
        reference.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    if checkpoint is not None:
        if checkpoint.sharded is not None:  # written under torchrun: every rank reads its shards (sharded.py)
            load_sharded(checkpoint.sharded, parallel=parallel, model=model, optimizer=optimizer)
        else:
            parallel.load_optimizer_state(model, optimizer, checkpoint.optimizer)
        state = checkpoint.state
        restore_rng(checkpoint.rng)
    else:
        state = TrainState(run_id=config.run_id)
        torch.manual_seed(settings.seed)
    main = parallel.is_main
    board = StatusBoard(
        Status(
            run_id=config.run_id,
            step=state.step,
            policy_version=state.policy_version,
            skipped_steps=state.skipped_steps,
            last_checkpoint=str(settings.resume or ""),
        )
    )
    rollout = (
        RolloutClient(settings.rollout, config.run_id, rpc_timeout_s=settings.rpc_timeout_s)
        if connect and main
        else None
    )
    publisher = publisher_of(settings) if connect and main else None
    return Trainer(
        config=config,
        model=model,
        optimizer=optimizer,
        state=state,
        board=board,
        parallel=parallel,
        source=rollout,
        publisher=publisher,
        metrics=MetricsWriter(settings.run_dir) if main else None,
        reference=reference,
        compute=compute,
        model_files=model_files(start),
    )
