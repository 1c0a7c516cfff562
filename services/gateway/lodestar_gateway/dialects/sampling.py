"""The sampling fields of every dialect, read by one helper: where each dialect keeps them differs, what
they mean does not (temperature, top_p, top_k, the output-token limit, seed, stop sequences).

Fields a vendor defines that change sampling but that the gateway cannot honour (penalties, logit bias,
min_p, structured-output schemas...) are accepted and ignored; docs/gateway.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

from lodestar.v1 import common_pb2
from lodestar_gateway.dialects import fields as f
from lodestar_gateway.dialects.fields import JsonObject


@dataclass(frozen=True)
class SamplingFields:
    """Where one dialect keeps its sampling fields (names as sent)."""

    max_tokens: tuple[str, ...]
    """Output-token limit field names, the first one present wins."""
    stop: str | None
    temperature: str = "temperature"
    top_p: str = "top_p"
    top_k: str = "top_k"
    seed: str | None = None
    max_tokens_required: bool = False
    temperature_max: float | None = 2.0
    top_k_minimum: int = 0
    """-1 where the vendor (vLLM-style) uses it for "off"."""


ANTHROPIC = SamplingFields(("max_tokens",), "stop_sequences", max_tokens_required=True, temperature_max=None)
OPENAI_CHAT = SamplingFields(("max_completion_tokens", "max_tokens"), "stop", seed="seed", top_k_minimum=-1)
OPENAI_RESPONSES = SamplingFields(("max_output_tokens",), None)
GOOGLE = SamplingFields(("maxOutputTokens",), "stopSequences", top_p="topP", top_k="topK", seed="seed")


def read_sampling(body: JsonObject, spec: SamplingFields, path: str = "") -> common_pb2.SamplingParams:
    """The canonical sampling parameters of a (decoded) body; raises InvalidArgumentError naming the field.
    Top-k <= 0 means "no top-k" and is left unset; seeds are taken modulo 2^64."""
    sampling = common_pb2.SamplingParams()
    for name in spec.max_tokens:
        if (limit := f.integer(body, name, path, minimum=1, required=spec.max_tokens_required)) is not None:
            sampling.max_tokens = limit
            break
    if (value := f.number(body, spec.temperature, path, minimum=0.0, maximum=spec.temperature_max)) is not None:
        sampling.temperature = value
    if (value := f.number(body, spec.top_p, path, minimum=0.0, maximum=1.0)) is not None:
        sampling.top_p = value
    if (top_k := f.integer(body, spec.top_k, path, minimum=spec.top_k_minimum)) is not None and top_k > 0:
        sampling.top_k = top_k
    if spec.seed is not None and (seed := f.integer(body, spec.seed, path)) is not None:
        sampling.seed = seed & (2**64 - 1)
    if spec.stop is not None:
        sampling.stop.extend(f.string_list(body, spec.stop, path))
    return sampling
