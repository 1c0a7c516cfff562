"""The Engine protocol every inference backend implements (transformers, vllm, scripted), and its types.

An engine works on token ids only. Chat templating, stop strings, tool-call parsing, the server's token
cap and the context-length check all live above it (`lodestar_inference.templates`, `.generation`), in
exactly one place, so every backend produces the same assistant message for the same ids.

Contract of `Engine.generate(request)`:
- It is an async generator of `EngineStep`s. Each step carries the newly sampled token ids and, when
  `request.return_logprobs`, the fp32 logprob of each id under the *processed* distribution it was sampled
  from (temperature, then top-k, then top-p applied to the logits; log-softmax of what remains; greedy
  when temperature == 0, where the logprob is that of the unscaled distribution after top-k/top-p).
- A step may carry any number of ids (>= 1, except that a finishing step may carry none): engines deliver
  what was sampled since the consumer last asked, so a consumer that falls behind gets larger steps
  instead of a backlog of one-id steps.
- The last step has `finish_reason` set: "stop" when an end-of-turn / EOS id (`EngineInfo.eos_token_ids`)
  was sampled (that id is included in the step's `token_ids`), "length" when `sampling.max_tokens` new ids
  were produced or the context is full. No step follows a finished one.
- Every step of one request carries the same `policy_version`: the version that sampled its first token.
  An engine either never changes the weights under a running request (transformers: the old weights stay
  while a request runs on them; vllm with `weight_swap = "drain"`) or swaps them under it at a token
  boundary (vllm, `weight_swap = "keep"`): then its steps carry `version_spans`, which version sampled
  which of the request's tokens so far, and the tokens after the swap are sampled by the new weights over
  keys and values recomputed under them (no key or value of an older version is reused).
- Cancellation: the consumer closes the generator (`await gen.aclose()`, or a cancelled task whose
  `async for` is torn down). The engine must stop sampling for that request and free its slot / KV cache.
- Errors: `lodestar.errors.InvalidArgumentError` for a request the engine cannot run (e.g. prompt longer
  than the context), `UnavailableError` when not started or closed.

Weights: the server writes a streamed update to a safetensors file (or receives a checkpoint path),
reads its tensor metadata (`lodestar_inference.weights.read_safetensors_meta`), calls
`validate_weights(metas)` (raises InvalidArgumentError, nothing changes), then
`await update_weights(WeightUpdate(...))`, which swaps atomically and returns the new version.

Each backend module `services/inference/lodestar_inference/engines/<backend>.py` exposes
`def create_engine(settings: InferenceSettings) -> Engine` (see `lodestar_inference.engines.create`).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from lodestar.v1 import common_pb2

EngineFinishReason = Literal["stop", "length"]
"""Why an engine stopped: "stop" = EOS / end-of-turn id sampled; "length" = max_tokens or context full."""


@dataclass(frozen=True)
class SamplingOptions:
    """Resolved sampling parameters (the server has applied defaults and its token cap)."""

    max_tokens: int
    """New ids to sample at most (>= 1)."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 disables."""
    top_k: int = 0
    """Keep the k most likely ids; 0 disables."""
    seed: int | None = None
    """Seed of this request's own random generator (reproducible sampling); None = nondeterministic."""


@dataclass(frozen=True)
class EngineRequest:
    """One generation: a prompt of token ids and how to sample its continuation."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingOptions
    return_logprobs: bool = True
    """When False the engine may leave `EngineStep.logprobs` empty (benchmarks of capture cost)."""
    messages: tuple[common_pb2.ChatMessage, ...] = ()
    """The canonical chat the prompt was rendered from. Only the scripted engine reads it."""
    tools: tuple[common_pb2.ToolDefinition, ...] = ()
    """Tools offered to the model. Only the scripted engine reads them."""
    final_only: bool = False
    """The caller reads nothing before the end: the engine may deliver the whole completion as one step
    (vLLM: `RequestOutputKind.FINAL_ONLY`, no per-step output to the server's event loop)."""
    hold_s: float = 0.0
    """Streaming pace: after the first step, an engine with `EngineInfo.paces_steps` delivers a step only
    from `next_delivery(last delivery, hold_s)` on (merging what was sampled meanwhile), or when the request
    finishes; the first and the finishing step go out at once. 0: every step at once. Engines without
    `paces_steps` ignore it (the caller paces)."""


def next_delivery(delivered: float, hold_s: float) -> float:
    """When a stream paced at `hold_s` that delivered a step at `delivered` (`time.perf_counter()`) may deliver
    the next one: the first multiple of `hold_s` on that clock at least `hold_s / 2` later.

    The gaps are hold_s / 2 to 1.5 hold_s, one delivery per hold_s on average, and every stream paced at the
    same interval comes due at the same instants: their deltas leave at the same engine step, and
    GenerateMany sends the deltas of one step as one message, instead of one message for every step at
    which some stream happened to be due."""
    return (math.floor(delivered / hold_s + 0.5) + 1) * hold_s


@dataclass(frozen=True)
class VersionSpan:
    """The request's sampled tokens [start, end) (0-based over all its steps) came from `version`'s weights."""

    version: int
    start: int
    end: int


@dataclass(frozen=True)
class EngineStep:
    """Ids sampled since the previous step of the same request."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """One fp32 logprob per id (processed distribution); empty when logprobs were not requested."""
    policy_version: int
    """The version that sampled the request's first token."""
    finish_reason: EngineFinishReason | None = None
    version_spans: tuple[VersionSpan, ...] = ()
    """The versions of every token of the request up to this step, in order, when an engine that swaps
    under running requests knows them; empty: every token so far is `policy_version`'s."""


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs to know about the served model."""

    backend: str
    """"transformers", "vllm" or "scripted"."""
    context_length: int
    """Maximum prompt + completion length in tokens."""
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    """Ids that end a turn (e.g. <|im_end|> and <|endoftext|>)."""
    paces_steps: bool = False
    """The engine honours `EngineRequest.hold_s` itself (cheaper than a consumer woken on every step)."""
    dtype: str = ""
    """The dtype the weights are served in ("float32", "bfloat16", "float16"; empty: none, e.g. scripted)."""


@dataclass(frozen=True)
class TensorMeta:
    """Name, shape and safetensors dtype string ("F32", "BF16", "F16", ...) of one tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class WeightUpdate:
    """A validated weight update to apply."""

    path: Path
    """A safetensors file, or a checkpoint directory holding `*.safetensors` files."""
    tensors: tuple[TensorMeta, ...]
    """Metadata of every tensor the update carries (already passed `validate_weights`)."""
    version: int
    """The policy version to publish once swapped."""
    files: tuple[Path, ...] = field(default=())
    """The safetensors files making up the update (the file itself, or those found in the directory)."""


@runtime_checkable
class Engine(Protocol):
    """A backend that samples token ids with logprobs and can swap its weights."""

    async def start(self) -> None:
        """Load the model; after this `info()` and `generate()` work."""
        ...

    async def close(self) -> None:
        """Stop every running request and free the model."""
        ...

    def info(self) -> EngineInfo:
        """Static facts about the served model."""
        ...

    @property
    def policy_version(self) -> int:
        """The version new requests start on."""
        ...

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        """Sample a continuation of `request.prompt_ids` (see the module docstring for the contract)."""
        ...

    def validate_weights(self, tensors: Sequence[TensorMeta]) -> None:
        """Raise InvalidArgumentError naming the first tensor whose name, shape or dtype does not fit."""
        ...

    async def update_weights(self, update: WeightUpdate) -> int:
        """Swap to the update's weights atomically; return the version now served (`update.version`).

        New requests use the new weights; running ones finish on the weights they started with or, on an
        engine that swaps under them, continue on the new weights with `EngineStep.version_spans` saying
        where (see the module docstring). On failure the old weights keep serving and the error is raised
        (InvalidArgumentError for a bad update).
        """
        ...
