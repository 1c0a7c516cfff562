"""Logit processing and sampling shared by the transformers engine and the logprob tests (torch).

`processed_logprobs` is THE definition of the distribution a token is sampled from, matching vLLM's
`logprobs_mode="processed_logprobs"`: divide by the temperature, mask everything below the k-th largest
logit (top-k), then mask the low tail whose cumulative probability is at most 1 - p (top-p; the most likely
id always stays), and take the log-softmax in fp32. Greedy requests (temperature 0) get the log-softmax of
the raw logits: top-k/top-p cannot change an argmax, and this is what the vLLM engine reports for them too,
so both backends agree whatever the request's top-k/top-p.
"""

from __future__ import annotations

import torch

_EPS = 1e-5


def processed_logprobs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Log-probabilities of the processed distribution over the last dimension of `logits` ([..., V])."""
    scores = logits.to(torch.float32)
    if temperature <= _EPS:
        return torch.log_softmax(scores, dim=-1)
    scores = scores / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab or top_p < 1.0:
        flat = scores.reshape(-1, vocab)
        ordered, order = flat.sort(dim=-1, descending=False)
        if 0 < top_k < vocab:
            kth = ordered[:, vocab - top_k].unsqueeze(-1)
            ordered = ordered.masked_fill(ordered < kth, float("-inf"))
        if top_p < 1.0:
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            tail = cumulative <= 1.0 - top_p
            tail[:, -1] = False
            ordered = ordered.masked_fill(tail, float("-inf"))
        scores = ordered.scatter(-1, order, ordered).reshape(scores.shape)
    return torch.log_softmax(scores, dim=-1)


def sample(logprobs: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """One id from a processed distribution ([V]); the most likely id when greedy."""
    if temperature <= _EPS:
        return int(torch.argmax(logprobs).item())
    return int(torch.multinomial(logprobs.exp(), 1, generator=generator).item())
