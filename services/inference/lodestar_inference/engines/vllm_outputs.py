"""Reading vLLM's outputs for the `vllm` engine: which policy version sampled which token, and the sampled
logprobs (lodestar_inference/engines/vllm.py; vLLM's objects are read by attribute, vllm is not imported)."""

from __future__ import annotations

from typing import Any

from lodestar_inference.engine import VersionSpan


class VersionLabels:
    """Which version sampled which token of one vLLM request, from vLLM's own per-token labels.

    The engine core stamps every batch of outputs with the weight version set last (`update_weight_version`,
    called inside the paused window of a swap), and the output processor notes, per request, the token index
    where that label changes (`RequestState.weight_version_starts`); it hands them out as spans only with the
    final output (`CompletionOutput.weight_versions`). A stream that ends before it (a stop sequence, a
    cancelled client) never sees that output, so after each output taken from the request's queue the
    starts are read from the request's state: the output handler records a batch's label and queues its
    tokens in one synchronous pass, so what is read right after a `get` covers exactly the tokens taken."""

    def __init__(self, llm: Any, request_id: str, admitted: int, *, fixed: bool = False) -> None:
        self._fixed = fixed
        """Every token is the admitted version's (native LoRA: the request keeps its adapter; vLLM's labels,
        which name base-weight versions, are not read)."""
        processor = getattr(llm, "output_processor", None)
        self._states: dict[str, Any] = getattr(processor, "request_states", None) or {}
        self._request_id = request_id
        self._admitted = admitted
        """The version served when the request was admitted: the label of tokens vLLM labelled otherwise."""
        self._starts: list[tuple[int, int]] = []
        self._taken = 0

    def observe(self, final_spans: Any, new_tokens: int) -> None:
        """Update after an output with `new_tokens` ids (`final_spans`: the finished output's own spans)."""
        self._taken += new_tokens
        if self._fixed:
            return
        if final_spans is not None:
            starts = [(span.version, span.start) for span in final_spans]
        else:
            state = self._states.get(self._request_id)
            if state is None:
                return
            starts = list(getattr(state, "weight_version_starts", ()))
        self._starts = [(self._version(label), start) for label, start in starts]

    def _version(self, label: str) -> int:
        try:
            return int(label)
        except ValueError:  # "default": a label set before this engine set one
            return self._admitted

    @property
    def first(self) -> int:
        """The version of the request's first token (the admitted one before any token)."""
        return self._starts[0][0] if self._starts else self._admitted

    @property
    def spans(self) -> tuple[VersionSpan, ...]:
        """The spans over the tokens taken so far; empty while one version sampled them all."""
        if len(self._starts) < 2:
            return ()
        ends = [start for _, start in self._starts[1:]] + [self._taken]
        return tuple(VersionSpan(version, start, end) for (version, start), end in zip(self._starts, ends, strict=True))


def sampled_logprobs(ids: list[int], entries: Any) -> list[float]:
    """Each sampled id's logprob: vLLM's flat list as it is (one entry per position), else one lookup each."""
    flat = getattr(entries, "logprobs", None)
    if isinstance(flat, list) and len(flat) == len(ids) and entries.token_ids == ids:
        return flat
    return [entry[token].logprob for token, entry in zip(ids, entries or [], strict=True)]
