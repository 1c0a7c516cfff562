"""Sampling policies (lodestar.v1.SamplingPolicy): their defaults and checks, and the sampling a call uses.

The training run, not the harness, owns the sampling distribution (docs/runs.md, "Sampling policy"). A
session a node runs carries its run's `SamplingPolicy`; `applied_sampling` replaces the temperature, top_p
and top_k of every request with the policy's, and keeps what is the harness's business (max_tokens, stop
sequences, seed). The result always has temperature, top_p and top_k set, so a CallRecord says which
distribution its logprobs come from without knowing the inference server's defaults. A session without a
policy (or with mode HARNESS) samples as its client asks, defaults resolved the same way.

Shared by the gateway node (enforces), rollout (validates and fills a run's policy), the trainer (reads what
a call used) and the CLI; no service state here.
"""

from __future__ import annotations

import math

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import common_pb2

DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = 0


def enforces(policy: common_pb2.SamplingPolicy | None) -> bool:
    """Whether `policy` overrides the harness (mode RUN, or unspecified, which means RUN)."""
    return policy is not None and policy.mode != common_pb2.SAMPLING_MODE_HARNESS


def applied_sampling(
    requested: common_pb2.SamplingParams, policy: common_pb2.SamplingPolicy | None
) -> common_pb2.SamplingParams:
    """The parameters a call samples with (a new message; `requested` is left as it is)."""
    used = common_pb2.SamplingParams()
    used.CopyFrom(requested)
    source: common_pb2.SamplingPolicy | common_pb2.SamplingParams = (
        policy if policy is not None and enforces(policy) else requested
    )
    used.temperature = source.temperature if source.HasField("temperature") else DEFAULT_TEMPERATURE
    used.top_p = source.top_p if source.HasField("top_p") else DEFAULT_TOP_P
    used.top_k = source.top_k if source.HasField("top_k") else DEFAULT_TOP_K
    return used


def validate_policy(policy: common_pb2.SamplingPolicy, where: str = "sampling") -> None:
    """InvalidArgumentError naming the first out-of-range value of `policy` (unset values are fine)."""
    if policy.HasField("temperature") and not (math.isfinite(policy.temperature) and policy.temperature > 0.0):
        raise InvalidArgumentError(f"{where}.temperature must be > 0, got {policy.temperature}")
    if policy.HasField("top_p") and not 0.0 < policy.top_p <= 1.0:
        raise InvalidArgumentError(f"{where}.top_p must be in (0, 1], got {policy.top_p}")
    if policy.HasField("top_k") and policy.top_k < 0:
        raise InvalidArgumentError(f"{where}.top_k must be >= 0 (0: off), got {policy.top_k}")


def resolved_policy(policy: common_pb2.SamplingPolicy) -> common_pb2.SamplingPolicy:
    """A copy of `policy` with the mode and every unset value at its default (what a run's spec shows)."""
    filled = common_pb2.SamplingPolicy()
    filled.CopyFrom(policy)
    if filled.mode == common_pb2.SAMPLING_MODE_UNSPECIFIED:
        filled.mode = common_pb2.SAMPLING_MODE_RUN
    if not filled.HasField("temperature"):
        filled.temperature = DEFAULT_TEMPERATURE
    if not filled.HasField("top_p"):
        filled.top_p = DEFAULT_TOP_P
    if not filled.HasField("top_k"):
        filled.top_k = DEFAULT_TOP_K
    return filled


def check_trainable(policy: common_pb2.SamplingPolicy, where: str = "sampling") -> None:
    """InvalidArgumentError unless a trainer can recompute the distribution `policy` samples from: mode RUN
    (the harness does not choose), a temperature > 0, top_p 1 and top_k off (docs/trainer.md says why)."""
    validate_policy(policy, where)
    if policy.mode == common_pb2.SAMPLING_MODE_HARNESS:
        raise InvalidArgumentError(
            f"{where}.mode HARNESS lets each harness choose how to sample; a training run needs mode RUN"
        )
    if policy.HasField("top_p") and policy.top_p < 1.0:
        raise InvalidArgumentError(
            f"{where}.top_p {policy.top_p:g}: the trainer recomputes temperature-only distributions (top_p 1, top_k 0)"
        )
    if policy.HasField("top_k") and policy.top_k > 0:
        raise InvalidArgumentError(
            f"{where}.top_k {policy.top_k}: the trainer recomputes temperature-only distributions (top_p 1, top_k 0)"
        )
