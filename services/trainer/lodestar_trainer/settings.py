"""Settings of the trainer service (`lodestar trainer serve`, the `[trainer]` config table), grouped by concern.

The top level says which run to train, from which model, and where the other services are; the sections say
how: `compute`, `batch` (the planner), `loss`, `optimizer`, `metrics`, `weights` (publishing), `checkpoints` and
`lora`.
Wiring hands each section to the part that uses it (wiring.py). A top-level field is a flag (`--run-dir`), an
environment variable (`LODESTAR_TRAINER_RUN_DIR`) and a key of `[trainer]`; a section's field is a flag
`--batch.micro-batch-tokens`, a variable `LODESTAR_TRAINER_BATCH__MICRO_BATCH_TOKENS` and a key of
`[trainer.batch]`. The flat keys of the earlier layout are refused with their new place (`MOVED`). Without
`--model` and `--run` the service starts idle: it serves health and GetStatus (WAITING, with the reason in
`error`) and trains nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from lodestar.errors import InvalidArgumentError
from lodestar.settings import EtcdClientSettings, SettingsSection


class ComputeSettings(SettingsSection):
    """How and where the model computes: device, precision, attention, parallelism, seed."""

    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1."""
    dtype: Literal["float32", "bfloat16"] | None = None
    """Compute dtype of forward/backward; unset: bfloat16 on CUDA (fp32 flex attention is several times slower
    there), float32 elsewhere. The trained weights, optimizer state, checkpoints and pushed weights stay fp32
    (master weights); the log-softmax and the loss are always fp32."""
    attention: Literal["auto", "flex", "explicit"] = "auto"
    """Attention backend of the trainer's forward/backward: "flex" = FlexAttention with the micro-batch's tree /
    document mask as a BlockMask, compiled (CUDA only: torch has no flex backward on CPU); "explicit" =
    block-sparse masked softmax in plain matmuls (any device); "auto": flex on CUDA, explicit elsewhere. Both
    keep the softmax statistics in fp32 (docs/trainer.md)."""
    activation_checkpointing: bool | None = None
    """Recompute each decoder layer in the backward instead of keeping its activations (long sessions fit in
    GPU memory for ~1/3 more compute); unset: on for CUDA, off on CPU."""
    parallel: Literal["fsdp2", "ddp"] = "fsdp2"
    """Under torchrun: shard the model with FSDP2, or replicate it (DDP-style gradient all-reduce)."""
    seed: int = 0
    """torch seed of a fresh start (a resumed run restores the checkpoint's RNG state)."""

    def compute_dtype(self) -> Literal["float32", "bfloat16"]:
        """`dtype`, unset resolved by device: bfloat16 on CUDA, float32 elsewhere."""
        if self.dtype is not None:
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") else "float32"

    def checkpointing(self) -> bool:
        """`activation_checkpointing`, unset resolved by device: on for CUDA, off elsewhere."""
        if self.activation_checkpointing is not None:
            return self.activation_checkpointing
        return self.device.startswith("cuda")

    def attention_backend(self) -> Literal["flex", "explicit"]:
        """`attention` with "auto" resolved by device (InvalidArgumentError: flex without CUDA)."""
        cuda = self.device.startswith("cuda")
        if self.attention == "flex" and not cuda:
            raise InvalidArgumentError(
                "--compute.attention flex needs a CUDA device: flex attention has no backward on CPU"
            )
        if self.attention == "auto":
            return "flex" if cuda else "explicit"
        return self.attention


class BatchSettings(SettingsSection):
    """What one step trains on (the planner, planner.py): which groups, built and packed how."""

    builder: Literal["per_request", "prefix_merging", "tree"] = "prefix_merging"
    """How calls become training sequences: `per_request` (each alone), `prefix_merging` (a session's chain of
    calls), `tree` (one prefix tree of the whole step: what all sessions share is computed once)."""
    advantage: Literal["zscore", "mean", "leave_one_out"] = "zscore"
    """Group-relative advantage."""
    groups_per_step: int = 1
    """Groups (of sessions that all got some reward signal) per optimizer step."""
    micro_batch_tokens: int = 8192
    """Token budget of one packed forward/backward pass."""
    max_staleness: int = -1
    """Drop a group whose oldest call is more than this many policy versions behind the trainer's version when
    the group is taken (-1: rely on rollout's bound alone; a group already sent down the stream may then arrive
    staler than the run's max_staleness, because the stream reads ahead while a step runs)."""
    stop_after_no_signal_groups: int = 0
    """Stop training when this many groups in a row had no reward signal (every sample of each scored alike:
    the policy solves these tasks, or they are beyond it), instead of sampling the rest of the run for nothing;
    GetStatus says STOP_REASON_NO_SIGNAL. 0: never (train until `steps`, Stop, or the run's end)."""


class LossSettings(SettingsSection):
    """The GRPO policy loss (step/loss.py) and its off-policy correction."""

    clip_low: float = 0.2
    """PPO ratio clip: lower bound 1 - clip_low."""
    clip_high: float = 0.28
    """PPO ratio clip: upper bound 1 + clip_high (clip-higher)."""
    aggregation: Literal["token", "sequence_mean"] = "token"
    """Loss aggregation: over all target tokens of the step, or the mean of per-sample means."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the initial model (0 disables it and loads no reference)."""
    behaviour_correction: Literal["ppo_clip", "tis"] = "ppo_clip"
    """Off-policy handling: PPO ratio against the captured inference logprobs (ppo_clip), or the ratio against
    the trainer's own pre-step logprobs times a truncated importance weight vs the captured ones (tis)."""
    tis_cap: float = 2.0
    """Cap of the truncated importance weight pi_trainer / pi_inference (behaviour_correction=tis)."""


class OptimizerSettings(SettingsSection):
    """AdamW and gradient clipping."""

    lr: float = 1e-6
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay (0: none)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 disables clipping)."""


class MetricsSettings(SettingsSection):
    """How a step's statistics are judged (step/optimizer_step.py)."""

    pass_threshold: float | None = None
    """A sample counts as passed in the pass-rate metric when its reward is at least this. Unset: reward 1.0
    passes while the verifier's rewards are all 0 or 1 (a pass/fail verifier); once a partial reward appears,
    no pass rate is logged (partial credit defines no passing), and the live view and plot leave it out."""
    mismatch_warn_nats: float = 0.1
    """Warn when a step's mean |trainer - inference| logprob over some harness's sampled tokens is above this
    many nats (a warning log line and GetStatus.warning; per-harness values are the step metrics
    `logprob_diff_mean/<harness>`). fp32 on CPU agrees to ~1e-6; bf16 inference and trainer typically to
    ~1e-2. 0 disables the warning."""


class WeightsSettings(SettingsSection):
    """How each policy version reaches the inference replicas (weights/)."""

    transport: Literal["grpc", "shared_fs", "broadcast"] = "grpc"
    """How each policy version's bytes reach the replicas (gRPC is the control plane either way):
    "grpc" = one UpdateWeights stream per replica (works everywhere); "shared_fs" = written once to
    `weights.dir` and every replica sent only its path (trainer and replicas on one filesystem; each replica's
    --checkpoint-dirs must list that directory); "broadcast" = a torch.distributed broadcast from the trainer
    (rank 0) to every replica at once (gloo over TCP, or NCCL), a replica the broadcast misses getting the
    version over gRPC. Choosing one: docs/deploy.md ("Weight transports"), figures: docs/benchmarks.md."""
    dir: Path | None = None
    """shared_fs: the directory versions are written to (only the newest is kept); default
    <run_dir>/weights. On one machine /dev/shm/<name> is fastest (RAM)."""
    async_push: bool = False
    """Push each policy version from a worker thread while the next step trains (at most one version in
    flight; rollout hears a version once inference serves it). Off: every step waits for its push."""
    push_timeout_s: float = 300.0
    """Deadline of one UpdateWeights call."""
    push_attempts: int = 3
    """UpdateWeights attempts on UNAVAILABLE / DEADLINE_EXCEEDED before the trainer fails."""
    broadcast_backend: Literal["gloo", "nccl"] = "gloo"
    """broadcast: gloo (CPU memory, TCP; tested) or nccl (trainer and replicas on CUDA GPUs; untested in CI)."""
    broadcast_host: str = ""
    """broadcast: the address replicas reach the trainer's rendezvous store and gloo sockets at, and the only one
    they listen on; default: this host's address on the route to the first replica. The store has no
    authentication of its own (each push's peers prove a per-push secret: docs/security.md)."""
    broadcast_port: int = 0
    """broadcast: the rendezvous store's TCP port; 0: a free port per push (gloo's own sockets always take free
    ports: open the trainer's host to the replicas)."""
    broadcast_timeout_s: float = 30.0
    """broadcast: the most a rendezvous or one bucket may take; past it the replicas still missing the version
    get it over gRPC (a dead replica costs a push at most this, not the UpdateWeights deadline)."""
    broadcast_bucket_mb: int = 256
    """broadcast: tensors travel in buckets of whole tensors of up to this many MiB (each bucket one
    collective, with the timeout above)."""
    changed_only: bool = False
    """Send each version as only the tensors that changed (compared bit for bit in the serving dtype) since the
    version the replicas serve; a replica that serves another (missed a push, restarted) refuses the diff and
    gets the full state. Costs one copy of the model in the serving dtype (the snapshot's, with async_push)
    and a comparison pass per push; pays only when tensors stay unchanged (frozen parts, sparse updates):
    after a full AdamW step nearly all change (docs/trainer.md "Changed-only sync")."""


class CheckpointSettings(SettingsSection):
    """When and where checkpoints are written (control.py, checkpoint.py)."""

    dir: Path | None = None
    """Checkpoints directory; default <run_dir>/checkpoints."""
    every: int = 0
    """Write a checkpoint every N steps and at the end (0: only on SaveCheckpoint / Stop with save_checkpoint)."""


class LoraSettings(SettingsSection):
    """LoRA: train low-rank adapters on a frozen base model instead of every weight (lora.py, peft)."""

    enabled: bool = False
    """Train a LoRA adapter (the base weights frozen, the optimizer state only the adapter's); each policy
    version pushed to inference is the adapter alone, checkpoints hold the adapter (docs/trainer.md "LoRA")."""
    rank: int = 16
    """Rank r of each adapter (A: r x in, B: out x r)."""
    alpha: float = 32.0
    """Scale numerator: the adapter adds (alpha / rank) * B @ A to each target weight."""
    dropout: float = 0.0
    """Dropout on the adapter's input in training (0: a step is deterministic given its batch)."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names (last component) of the linear layers that get an adapter; the LM head and embeddings cannot."""


MOVED: dict[str, str] = {
    "device": "compute.device",
    "dtype": "compute.dtype",
    "attention": "compute.attention",
    "activation_checkpointing": "compute.activation_checkpointing",
    "parallel": "compute.parallel",
    "seed": "compute.seed",
    "builder": "batch.builder",
    "advantage": "batch.advantage",
    "groups_per_step": "batch.groups_per_step",
    "micro_batch_tokens": "batch.micro_batch_tokens",
    "max_staleness": "batch.max_staleness",
    "stop_after_no_signal_groups": "batch.stop_after_no_signal_groups",
    "clip_low": "loss.clip_low",
    "clip_high": "loss.clip_high",
    "aggregation": "loss.aggregation",
    "kl_coef": "loss.kl_coef",
    "behaviour_correction": "loss.behaviour_correction",
    "tis_cap": "loss.tis_cap",
    "lr": "optimizer.lr",
    "weight_decay": "optimizer.weight_decay",
    "max_grad_norm": "optimizer.max_grad_norm",
    "pass_threshold": "metrics.pass_threshold",
    "mismatch_warn_nats": "metrics.mismatch_warn_nats",
    "weights_transport": "weights.transport",
    "weights_dir": "weights.dir",
    "async_push": "weights.async_push",
    "push_timeout_s": "weights.push_timeout_s",
    "push_attempts": "weights.push_attempts",
    "broadcast_backend": "weights.broadcast_backend",
    "broadcast_host": "weights.broadcast_host",
    "broadcast_port": "weights.broadcast_port",
    "broadcast_timeout_s": "weights.broadcast_timeout_s",
    "broadcast_bucket_mb": "weights.broadcast_bucket_mb",
    "checkpoint_dir": "checkpoints.dir",
    "checkpoint_every": "checkpoints.every",
}
"""The flat keys of the earlier layout and their places now: refused wherever given (lodestar/settings.py)."""


class TrainerSettings(EtcdClientSettings):
    section = "trainer"
    moved: ClassVar[Mapping[str, str]] = MOVED

    port: int = 50054
    rollout: str = "127.0.0.1:50053"
    """RolloutService address (groups come from StreamGroups), or a leader's and its standbys' addresses
    separated by commas: the trainer moves to whichever answers after a failover (docs/deploy.md)."""
    inference: str = "127.0.0.1:50051"
    """InferenceService address (weights are pushed with UpdateWeights), or several replicas' addresses separated
    by commas (serialized once, pushed to all at once: lodestar_trainer/weights/publish.py); empty: push nothing."""
    inference_discovery: Literal["static", "etcd"] = "static"
    """Where the replicas to push weights to come from: "static" = the addresses of --inference; "etcd" = every
    replica registered in etcd at each push (`lodestar inference serve --etcd`; needs --etcd): a replica that
    joins gets the next version's full weights, one that left is not pushed to (docs/deploy.md)."""
    etcd: str | None = None
    """etcd endpoint of --inference-discovery etcd (https://host:port with --etcd-tls-*, or http:// on loopback)."""
    etcd_prefix: str = "/lodestar/"
    """Root of lodestar's etcd keys (replicas register under <prefix>inference/)."""
    run: str | None = None
    """Run to train on (its groups only)."""
    model: Path | None = None
    """Hugging Face causal LM directory to start from (config, safetensors weights, tokenizer)."""
    resume: Path | None = None
    """Checkpoint directory to continue from exactly (weights, optimizer, step, version, RNG, groups read)."""
    run_dir: Path = Path(".lodestar/trainer")
    """Where metrics.jsonl, TensorBoard event files and (by default) checkpoints go."""
    steps: int = 0
    """Optimizer steps to run, counting from the resumed step; 0 runs until stopped or the run has no more groups."""
    rpc_timeout_s: float = 30.0
    """Deadline of ReportPolicyVersion (the group stream itself waits without one and reconnects for 10 min)."""

    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    """Device, compute dtype, attention backend, activation checkpointing, parallelism, seed."""
    batch: BatchSettings = Field(default_factory=BatchSettings)
    """Which groups make a step and how they become micro-batches."""
    loss: LossSettings = Field(default_factory=LossSettings)
    """The policy loss: clip bounds, aggregation, KL, off-policy correction."""
    optimizer: OptimizerSettings = Field(default_factory=OptimizerSettings)
    """AdamW's learning rate and weight decay, gradient clipping."""
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    """The pass threshold and the trainer-inference mismatch warning."""
    weights: WeightsSettings = Field(default_factory=WeightsSettings)
    """Publishing each policy version to inference: transport, pushes, broadcast."""
    checkpoints: CheckpointSettings = Field(default_factory=CheckpointSettings)
    """Where and how often checkpoints are written."""
    lora: LoraSettings = Field(default_factory=LoraSettings)
    """LoRA adapters instead of full fine-tuning (off by default)."""

    def checkpoint_dir(self) -> Path:
        """The checkpoints directory: `checkpoints.dir`, default <run_dir>/checkpoints."""
        return self.checkpoints.dir or self.run_dir / "checkpoints"

    def weights_dir(self) -> Path:
        """The shared_fs directory: `weights.dir`, default <run_dir>/weights."""
        return self.weights.dir or self.run_dir / "weights"


SETTINGS = TrainerSettings
