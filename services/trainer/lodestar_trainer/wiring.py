"""Build a ready-to-run Trainer from TrainerSettings: model, optimizer, resume state, clients, metrics.

Start from `--model DIR`, or from `--resume CHECKPOINT` (weights, optimizer state, step, policy version,
groups read and RNG state; the run must match). Each part gets its section of the settings as it is (the
planner `batch`, the step `loss`, `optimizer` and `metrics`, the control plane `weights` and `checkpoints`).
Under torchrun only rank 0 gets the rollout and inference clients (the replicas of --inference, or those
registered in etcd) and the metrics writer. The KL reference (loss.kl_coef > 0) is the starting model
(`--model`, else the resumed checkpoint's weights), frozen, in the compute dtype. The trained model is always
fp32; `--compute.dtype bfloat16` sets the compute dtype (precision.py). With `[trainer.lora]` the base model
(`--model`, or the base a resumed adapter names) gets LoRA adapters (lora.py) and the optimizer holds only
theirs; LoRA runs in one process (refused under torchrun).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar.etcd import tls_from_settings
from lodestar.grpc.client import split_targets
from lodestar_trainer.checkpoint import TrainState, load_checkpoint, restore_rng
from lodestar_trainer.control import Publisher
from lodestar_trainer.loop import Trainer
from lodestar_trainer.lora import apply_lora, load_adapter_state, lora_config, read_adapter
from lodestar_trainer.metrics import MetricsWriter
from lodestar_trainer.model import DTYPES, enable_activation_checkpointing, load_model, model_files
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.parallel.sharded import load_sharded
from lodestar_trainer.rollout_client import RolloutClient
from lodestar_trainer.settings import TrainerSettings
from lodestar_trainer.status import Status, StatusBoard
from lodestar_trainer.step import adamw
from lodestar_trainer.step.flex import warm_up_model
from lodestar_trainer.step.precision import ComputeCopy, set_matmul_precision
from lodestar_trainer.weights.publish import FanoutPublisher, publisher_for
from lodestar_trainer.weights.pushing import changed_only
from lodestar_trainer.weights.replica_discovery import DiscoveredReplicas
from lodestar_trainer.weights.transports import transport_publisher


def check(settings: TrainerSettings) -> None:
    """Refuse settings no part can train with (InvalidArgumentError / FailedPreconditionError naming them)."""
    if settings.run is None:
        raise FailedPreconditionError("the trainer needs --run RUN_ID")
    if settings.model is None and settings.resume is None:
        raise FailedPreconditionError("the trainer needs --model DIR (or --resume CHECKPOINT)")
    batch = settings.batch
    if batch.micro_batch_tokens <= 0 or batch.groups_per_step <= 0:
        raise InvalidArgumentError("batch.micro_batch_tokens and batch.groups_per_step must be positive")
    if batch.stop_after_no_signal_groups < 0:
        raise InvalidArgumentError("batch.stop_after_no_signal_groups must be >= 0 (0: never stop for it)")
    if not settings.metrics.mismatch_warn_nats >= 0:
        raise InvalidArgumentError("metrics.mismatch_warn_nats must be >= 0 (0: never warn)")
    settings.compute.attention_backend()
    if settings.lora.enabled:
        lora_config(settings.lora)
        if settings.weights.changed_only:
            raise InvalidArgumentError(
                "lora.enabled pushes the adapter alone (each version whole, merged onto the base): "
                "weights.changed_only does not apply to it; leave it off"
            )


def with_lora_base(settings: TrainerSettings) -> TrainerSettings:
    """A LoRA run resumed without `--model` trains on the base model its adapter's config names."""
    if not settings.lora.enabled or settings.resume is None or settings.model is not None:
        return settings
    base = read_adapter(settings.resume)[1].get("base_model_name_or_path")
    if not base:
        raise FailedPreconditionError(f"the adapter in {settings.resume} names no base model: give --model")
    return settings.model_copy(update={"model": Path(base)})


def publisher_of(settings: TrainerSettings) -> Publisher | None:
    """Where weights go: `--inference` (None when empty), or every replica registered in etcd; over the
    transport of `weights.transport` (services/trainer/lodestar_trainer/weights/transports.py); every push
    names the run (`--run`) as its writer (control.py `sync_inference`)."""
    weights, writer = settings.weights, settings.run or ""
    options = {"timeout_s": weights.push_timeout_s, "attempts": weights.push_attempts, "writer": writer}
    if settings.inference_discovery == "static":
        if not settings.inference:
            return None
        if weights.transport != "grpc":
            targets = split_targets(settings.inference)
            return transport_publisher(weights, settings.weights_dir(), targets, writer=writer)
        return publisher_for(settings.inference, **options)
    if not settings.etcd:
        raise InvalidArgumentError("--inference-discovery etcd needs --etcd: replicas register there")
    tls = tls_from_settings(settings.etcd, settings)
    replicas = DiscoveredReplicas(settings.etcd, prefix=settings.etcd_prefix, tls=tls)
    if weights.transport != "grpc":
        directory = settings.weights_dir()
        return transport_publisher(weights, directory, replicas.addresses, on_close=replicas.close, writer=writer)
    return FanoutPublisher(replicas.addresses, on_close=replicas.close, **options)


def create_trainer(settings: TrainerSettings, parallel: Parallel | None = None, *, connect: bool = True) -> Trainer:
    """A Trainer for `settings` (FailedPreconditionError without --run and --model/--resume).

    `connect=False` leaves out the rollout and inference clients (tests drive `train_step` directly).
    """
    check(settings)
    settings = with_lora_base(settings)
    assert settings.run is not None
    start = settings.resume or settings.model
    assert start is not None
    compute = settings.compute
    parallel = parallel or Parallel.from_env(mode=compute.parallel, device=compute.device)
    if settings.lora.enabled and parallel.distributed:
        raise InvalidArgumentError(
            "lora.enabled runs in one process: under torchrun (FSDP2 or DDP) LoRA is not supported yet"
        )
    checkpoint = load_checkpoint(settings.resume, rank=parallel.rank) if settings.resume else None
    if checkpoint is not None and checkpoint.state.run_id and checkpoint.state.run_id != settings.run:
        raise InvalidArgumentError(
            f"checkpoint {settings.resume} is of run {checkpoint.state.run_id!r}, not {settings.run!r}"
        )
    model, copy = _model(settings, start, parallel)
    if compute.attention_backend() == "flex":  # every bucket of the budget compiled now, not in a step (flex.py)
        dtype = DTYPES[compute.compute_dtype()]
        budget, kl = settings.batch.micro_batch_tokens, bool(settings.loss.kl_coef)
        warm_up_model(model, budget=budget, device=compute.device, dtype=dtype, reference=kl)
    reference: Any = None
    if settings.loss.kl_coef:
        reference = load_model(settings.model or start, device=compute.device, dtype=compute.compute_dtype()).eval()
        reference.requires_grad_(False)
    impl = adamw.implementation(compute.device)
    optimizer = adamw.adamw(
        [parameter for parameter in model.parameters() if parameter.requires_grad],  # all but a LoRA base
        lr=settings.optimizer.lr,
        weight_decay=settings.optimizer.weight_decay,
        impl=impl,
    )
    if checkpoint is not None:
        if checkpoint.sharded is not None:  # written under torchrun: every rank reads its shards (sharded.py)
            load_sharded(checkpoint.sharded, parallel=parallel, model=model, optimizer=optimizer)
        else:
            parallel.load_optimizer_state(model, optimizer, checkpoint.optimizer)
        adamw.conform(optimizer, impl)  # the checkpoint's groups name the implementation it was saved with
        state = checkpoint.state
        restore_rng(checkpoint.rng)
    else:
        state = TrainState(run_id=settings.run)
        torch.manual_seed(compute.seed)
    main = parallel.is_main
    board = StatusBoard(
        Status(
            run_id=settings.run,
            step=state.step,
            policy_version=state.policy_version,
            skipped_steps=state.skipped_steps,
            last_checkpoint=str(settings.resume or ""),
        )
    )
    rollout = (
        RolloutClient(settings.rollout, settings.run, rpc_timeout_s=settings.rpc_timeout_s)
        if connect and main
        else None
    )
    return Trainer(
        settings,
        model=model,
        optimizer=optimizer,
        state=state,
        board=board,
        vocab_size=int(model.config.vocab_size),
        parallel=parallel,
        source=rollout,
        publisher=changed_only(settings.weights, publisher_of(settings)) if connect and main else None,
        metrics=MetricsWriter(settings.run_dir) if main else None,
        reference=reference,
        compute=copy,
        model_files=model_files(start),
    )


def _model(settings: TrainerSettings, start: Path, parallel: Parallel) -> tuple[Any, ComputeCopy | None]:
    """The fp32 model wrapped for `parallel`, and its compute copy when the compute dtype is not fp32 (one
    process / DDP mode: precision.py)."""
    compute = settings.compute
    compute_dtype = DTYPES[compute.compute_dtype()]
    set_matmul_precision(compute.device, compute_dtype)
    if settings.lora.enabled:
        assert settings.model is not None  # with_lora_base
        loaded = apply_lora(load_model(settings.model, device=compute.device, dtype="float32"), settings.lora)
        if settings.resume is not None:
            load_adapter_state(loaded, read_adapter(settings.resume)[0])
    else:
        loaded = load_model(start, device=compute.device, dtype="float32")
    if compute.checkpointing():
        enable_activation_checkpointing(loaded)  # before the compute copy, which keeps it
    model = parallel.wrap(loaded, compute_dtype)
    copy = None if compute_dtype == torch.float32 or parallel.shards else ComputeCopy(model, compute_dtype)
    return model, copy
