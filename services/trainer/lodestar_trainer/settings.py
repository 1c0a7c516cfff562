"""Settings of the trainer service (`lodestar trainer serve`, the `[trainer]` config table).

Every field is also a flag (`--micro-batch-tokens 8192`) and an environment variable
(`LODESTAR_TRAINER_MICRO_BATCH_TOKENS`). Without `--model` and `--run` the service starts idle: it serves
health and GetStatus (WAITING, with the reason in `error`) and trains nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lodestar.settings import EtcdClientSettings


class TrainerSettings(EtcdClientSettings):
    section = "trainer"

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
    checkpoint_dir: Path | None = None
    """Checkpoints directory; default <run_dir>/checkpoints."""

    builder: Literal["per_request", "prefix_merging", "tree"] = "prefix_merging"
    """How a group's calls become training sequences."""
    advantage: Literal["zscore", "mean", "leave_one_out"] = "zscore"
    """Group-relative advantage."""
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
    micro_batch_tokens: int = 8192
    """Token budget of one packed forward/backward pass."""
    groups_per_step: int = 1
    """Groups (of sessions that all got some reward signal) per optimizer step."""
    max_staleness: int = -1
    """Drop a group whose oldest call is more than this many policy versions behind the trainer's version when
    the group is taken (-1: rely on rollout's bound alone; a group already sent down the stream may then arrive
    staler than the run's max_staleness, because the stream reads ahead while a step runs)."""
    steps: int = 0
    """Optimizer steps to run, counting from the resumed step; 0 runs until stopped or the run has no more groups."""
    stop_after_no_signal_groups: int = 0
    """Stop training when this many groups in a row had no reward signal (every sample of each scored alike:
    the policy solves these tasks, or they are beyond it), instead of sampling the rest of the run for nothing;
    GetStatus says STOP_REASON_NO_SIGNAL. 0: never (train until `steps`, Stop, or the run's end)."""
    mismatch_warn_nats: float = 0.1
    """Warn when a step's mean |trainer - inference| logprob over some harness's sampled tokens is above this
    many nats (a warning log line and GetStatus.warning; per-harness values are the step metrics
    `logprob_diff_mean/<harness>`). fp32 on CPU agrees to ~1e-6; bf16 inference and trainer typically to
    ~1e-2. 0 disables the warning."""
    lr: float = 1e-6
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay (0: none)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 disables clipping)."""
    checkpoint_every: int = 0
    """Write a checkpoint every N steps and at the end (0: only on SaveCheckpoint / Stop with save_checkpoint)."""
    pass_threshold: float | None = None
    """A sample counts as passed in the pass-rate metric when its reward is at least this. Unset: reward 1.0
    passes while the verifier's rewards are all 0 or 1 (a pass/fail verifier); once a partial reward appears,
    no pass rate is logged (partial credit defines no passing), and the live view and plot leave it out."""
    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1."""
    activation_checkpointing: bool | None = None
    """Recompute each decoder layer in the backward instead of keeping its activations (long sessions fit in
    GPU memory for ~1/3 more compute); unset: on for CUDA, off on CPU."""
    attention: Literal["auto", "flex", "explicit"] = "auto"
    """Attention backend of the trainer's forward/backward: "flex" = FlexAttention with the micro-batch's tree /
    document mask as a BlockMask, compiled (CUDA only: torch has no flex backward on CPU); "explicit" =
    block-sparse masked softmax in plain matmuls (any device); "auto": flex on CUDA, explicit elsewhere. Both
    keep the softmax statistics in fp32 (docs/trainer.md)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of forward/backward. The trained weights, optimizer state, checkpoints and pushed weights
    stay fp32 (master weights); the log-softmax and the loss are always fp32."""
    seed: int = 0
    """torch seed of a fresh start (a resumed run restores the checkpoint's RNG state)."""
    parallel: Literal["fsdp2", "ddp"] = "fsdp2"
    """Under torchrun: shard the model with FSDP2, or replicate it (DDP-style gradient all-reduce)."""
    push_timeout_s: float = 300.0
    """Deadline of one UpdateWeights call."""
    push_attempts: int = 3
    """UpdateWeights attempts on UNAVAILABLE / DEADLINE_EXCEEDED before the trainer fails."""
    async_push: bool = False
    """Push each policy version from a worker thread while the next step trains (at most one version in
    flight; rollout hears a version once inference serves it). Off: every step waits for its push."""
    weights_transport: Literal["grpc", "shared_fs", "broadcast"] = "grpc"
    """How each policy version's bytes reach the replicas (gRPC is the control plane either way):
    "grpc" = one UpdateWeights stream per replica (works everywhere); "shared_fs" = written once to
    `weights_dir` and every replica sent only its path (trainer and replicas on one filesystem; each replica's
    --checkpoint-dirs must list weights_dir); "broadcast" = a torch.distributed broadcast from the trainer
    (rank 0) to every replica at once (gloo over TCP, or NCCL), a replica the broadcast misses getting the
    version over gRPC. Choosing one: docs/deploy.md ("Weight transports"), figures: docs/benchmarks.md."""
    weights_dir: Path | None = None
    """shared_fs: the directory versions are written to (only the newest is kept); default
    <run_dir>/weights. On one machine /dev/shm/<name> is fastest (RAM)."""
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
    rpc_timeout_s: float = 30.0
    """Deadline of ReportPolicyVersion (the group stream itself waits without one and reconnects for 10 min)."""


SETTINGS = TrainerSettings
