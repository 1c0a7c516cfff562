"""The typed data that flows through the trainer: scored samples in, training sequences out.

A group's sessions become `Sample`s (one per scored session: its calls and its advantage). A builder turns
the samples of a group into `TrainingSequence`s. A sequence is a set of tokens with, for each token, the
index of its parent (the token before it; -1 for the first); a linear sequence has parent t-1 at every t,
a tree (shared prefixes computed once) has branching parents. Attention goes to ancestors only, position
ids are depths. Tokens are laid out in DFS pre-order: a parent comes before its children and every
subtree is a contiguous run (lodestar_trainer/step/attention.py relies on it and checks it). The loss is
defined over sparse *targets*: each target names a token of the sequence that was sampled by the policy,
and its logprob is read from the logits at that token's parent. Every sampled token of every call of every
sample is exactly one target, whatever the builder, which is why the three builders give the same loss.

This module owns the shapes only: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lodestar.policy_versions import call_token_versions
from lodestar.v1 import common_pb2


@dataclass(frozen=True)
class Sample:
    """One scored session of a group, ready for a builder."""

    sample_index: int
    """Index of the sample within the step's batch (targets point back to it)."""
    session_id: str
    reward: float
    advantage: float
    """Group-relative advantage, the same for every sampled token of the session."""
    calls: Sequence[common_pb2.CallRecord]
    """Every call of the session, in sequence order."""
    harness: str = ""
    """The harness kind that ran the session (per-harness metrics; "" when the result did not say)."""


@dataclass
class TrainingSequence:
    """Tokens with parent links and the sparse loss targets on them (see the module docstring).

    All per-token lists have length T = len(token_ids); all per-target lists have length N.
    """

    token_ids: list[int]
    parents: list[int]
    """parents[t] is the index of the token before token t (-1 for a root). t-1 in a linear sequence."""
    position_ids: list[int]
    """Depth of each token (0 for a root): the position the model saw it at."""
    target_tokens: list[int] = field(default_factory=list)
    """Index (into token_ids) of each sampled token that carries loss."""
    target_samples: list[int] = field(default_factory=list)
    """Sample index of each target (for per-sample aggregation and metrics)."""
    behaviour_logprobs: list[float] = field(default_factory=list)
    """Logprob of each target token as captured at inference (the behaviour policy)."""
    advantages: list[float] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=list)
    """Sampling temperature of each target's call: its logprob is recomputed under logits / temperature."""
    versions: list[int] = field(default_factory=list)
    """Policy version that sampled each target (its call's `policy_version`, or its span's when the weights
    were swapped while the call ran: `lodestar.policy_versions`)."""

    @property
    def is_linear(self) -> bool:
        return all(parent == index - 1 for index, parent in enumerate(self.parents))

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class BuildStats:
    """What a builder did to a batch of calls."""

    calls: int
    sequences: int
    call_tokens: int
    """Tokens in the calls (prompt + sampled, summed over calls): the per-request work."""
    sequence_tokens: int
    """Tokens in the built sequences: the work actually done."""
    merges: int = 0
    """Calls appended to an existing sequence."""
    breaks: int = 0
    """Calls that extended no earlier sequence of their session although the session had one."""

    @property
    def token_ratio(self) -> float:
        """call_tokens / sequence_tokens: the bound on the builder's wall-clock speedup over per_request."""
        return self.call_tokens / self.sequence_tokens if self.sequence_tokens else 1.0


@dataclass(frozen=True)
class BuildResult:
    sequences: list[TrainingSequence]
    stats: BuildStats


@dataclass
class MicroBatch:
    """Sequences packed into one forward pass (token budget), as flat lists; a packer makes them.

    `parents` indices are global within the micro-batch (a sequence's root has parent -1), so one
    block-diagonal / tree attention mask covers the whole micro-batch.
    """

    token_ids: list[int]
    parents: list[int]
    position_ids: list[int]
    target_tokens: list[int]
    target_samples: list[int]
    behaviour_logprobs: list[float]
    advantages: list[float]
    sequence_starts: list[int]
    """Start offset of each packed sequence."""
    temperatures: list[float] = field(default_factory=list)
    """Sampling temperature of each target (per-target list, length N); empty: 1.0 for every target."""
    versions: list[int] = field(default_factory=list)
    """Policy version that sampled each target (length N; empty: unknown)."""
    chunk_tokens: int = 0
    """0: one forward pass. Else the micro-batch is longer than the budget (one part whose path is longer than
    it) and its forward runs in chunks of this many tokens with KV reuse (step/forward.py)."""


def sampled_temperature(call: common_pb2.CallRecord) -> float:
    """The temperature of the distribution `call`'s tokens were sampled from (unset: inference's default 1.0).

    Raises ValueError when the trainer cannot recompute that distribution: top_p < 1 or top_k > 0 (the
    trainer recomputes temperature-scaled full-vocabulary logprobs only; docs/trainer.md says why) or
    greedy decoding (temperature 0: no distribution to take a ratio against)."""
    params, name = call.sampling, f"call {call.session_id}#{call.sequence}"
    fix = "give the run a sampling policy with top_p 1 and top_k 0 (docs/runs.md)"
    if params.HasField("top_p") and params.top_p < 1.0:
        raise ValueError(f"{name} was sampled with top_p {params.top_p:g}, which the trainer cannot recompute: {fix}")
    if params.HasField("top_k") and params.top_k > 0:
        raise ValueError(f"{name} was sampled with top_k {params.top_k}, which the trainer cannot recompute: {fix}")
    temperature = params.temperature if params.HasField("temperature") else 1.0
    if not temperature > 0.0:
        raise ValueError(f"{name} was decoded greedily (temperature {temperature:g}): not a sample to train on")
    return temperature


def check_call(call: common_pb2.CallRecord) -> None:
    """Raise ValueError naming the problem when a CallRecord cannot be trained on (incl. `sampled_temperature`)."""
    if not call.completion_token_ids:
        raise ValueError(f"call {call.session_id}#{call.sequence} has no sampled tokens")
    if len(call.completion_logprobs) != len(call.completion_token_ids):
        raise ValueError(
            f"call {call.session_id}#{call.sequence} has {len(call.completion_token_ids)} sampled ids "
            f"but {len(call.completion_logprobs)} logprobs"
        )
    if not call.prompt_token_ids:
        raise ValueError(f"call {call.session_id}#{call.sequence} has no prompt token ids")
    try:
        call_token_versions(call)
    except ValueError as error:
        raise ValueError(f"call {call.session_id}#{call.sequence}: {error}") from error
    sampled_temperature(call)
