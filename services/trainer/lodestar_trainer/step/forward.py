"""The policy forward pass of one micro-batch: the fp32 logprob of every loss target, and nothing more.

`target_logprobs(model, batch)` runs the model's base (`model.model`, a transformers causal LM of the
Llama/Qwen family) over the packed tokens with their position ids (depths) and the tree attention of
lodestar_trainer/step/attention.py (each token attends to its ancestors only: block-diagonal for packed linear
sequences, a tree mask for trees): FlexAttention with a BlockMask on CUDA (flex.py), block-sparse explicit
softmax elsewhere (attention.py), chosen by `attention`.
It then gathers the final hidden state only at the parents of the targets (a target's logprob is read
from the logits of the token before it) and applies `model.lm_head` with a log-softmax over the vocabulary
in chunks of `vocab_chunk` entries and `row_chunk` targets, each target's logits divided by the temperature
its call was sampled at (the run's sampling policy: CallRecord.sampling). The chunked log-softmax is an autograd
Function that recomputes each chunk's logits in the backward pass, so neither the [T, V] logits nor the
[N, V] logits of the targets ever exist: the extra memory is [row_chunk, vocab_chunk] (fp32) at a time.
(A 32K-token sequence with Qwen's 151,936 entries would need ~20 GB of fp32 logits.)

A micro-batch longer than its `chunk_tokens` (a part the splitter could not bring under the budget: a path from
the root longer than it, e.g. one long linear session; data/pack.py sets it) runs its base in chunks of that many
tokens with KV reuse: each chunk's queries attend to the keys and values the earlier chunks computed, layer by
layer (attention.py `ChunkLayout`), which stay in the autograd graph, so the logprobs and the gradient are the
one-pass ones and no pass computes more than `chunk_tokens` queries. The chunks use the explicit attention
whatever `attention` says (flex would compile per pair of query and key lengths).

Assumptions: the LM head is a plain linear map (optionally with bias; tied weights are fine); models
that scale or soft-cap their logits (Gemma 2, Cohere) are not supported and raise. The logsumexp and the
target logits are computed in fp32 whatever the model dtype.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from lodestar_trainer.data.batch import MicroBatch
from lodestar_trainer.model import TiedHead
from lodestar_trainer.step.attention import LAYOUT_KWARG, ChunkLayout, Layout, TreeLayout, use_tree_attention
from lodestar_trainer.step.flex import FlexLayout

DEFAULT_ROW_CHUNK = 4096
AttentionBackend = Literal["explicit", "flex"]


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lo: int, hi: int
) -> torch.Tensor:
    logits = hidden @ weight[lo:hi].float().T
    return logits + bias[lo:hi].float() if bias is not None else logits


class _ChunkedTargetLogprob(torch.autograd.Function):
    """log_softmax(scale[n] * (hidden @ weight.T + bias))[n, targets[n]] for each row n, chunked over rows and
    vocabulary (scale = 1 / the sampling temperature of row n's target)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        scale: torch.Tensor,
        vocab_chunk: int,
        row_chunk: int,
    ) -> torch.Tensor:
        rows, vocab = hidden.shape[0], weight.shape[0]
        lse = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        picked = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        for r0 in range(0, rows, row_chunk):
            h, c = hidden[r0 : r0 + row_chunk].float(), scale[r0 : r0 + row_chunk, None]
            running = torch.full((h.shape[0],), float("-inf"), device=hidden.device)
            for lo in range(0, vocab, vocab_chunk):
                logits = _chunk_logits(h, weight, bias, lo, lo + vocab_chunk).mul_(c)
                running = torch.logaddexp(running, torch.logsumexp(logits, 1))
            lse[r0 : r0 + row_chunk] = running
            t = targets[r0 : r0 + row_chunk]
            target_logits = (h * weight[t].float()).sum(1) + (bias[t].float() if bias is not None else 0.0)
            picked[r0 : r0 + row_chunk] = target_logits * c[:, 0]
        ctx.save_for_backward(hidden, weight, bias, targets, lse, scale)
        ctx.vocab_chunk, ctx.row_chunk = vocab_chunk, row_chunk
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, scale = ctx.saved_tensors
        vocab = weight.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        d_hidden = torch.zeros_like(hidden, dtype=torch.float32) if need_h else None
        d_weight = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        d_bias = torch.zeros_like(bias, dtype=torch.float32) if need_b and bias is not None else None
        grad = grad.float() * scale  # the chain rule through logits * scale
        for r0 in range(0, hidden.shape[0], ctx.row_chunk):
            h, g = hidden[r0 : r0 + ctx.row_chunk].float(), grad[r0 : r0 + ctx.row_chunk]
            t, row_lse = targets[r0 : r0 + ctx.row_chunk], lse[r0 : r0 + ctx.row_chunk]
            c = scale[r0 : r0 + ctx.row_chunk, None]
            # d logprob[n] / d scaled_logit[n, v] = 1[v == t_n] - softmax(scaled)[n, v]
            for lo in range(0, vocab, ctx.vocab_chunk):
                hi = min(vocab, lo + ctx.vocab_chunk)
                coef = _chunk_logits(h, weight, bias, lo, hi).mul_(c).sub_(row_lse[:, None]).exp_().mul_(-g[:, None])
                if d_hidden is not None:
                    d_hidden[r0 : r0 + ctx.row_chunk] += coef @ weight[lo:hi].float()
                if d_weight is not None:
                    d_weight[lo:hi] += coef.T @ h
                if d_bias is not None:
                    d_bias[lo:hi] += coef.sum(0)
            if d_hidden is not None:
                d_hidden[r0 : r0 + ctx.row_chunk] += g[:, None] * weight[t].float()
            if d_weight is not None:
                d_weight.index_add_(0, t, g[:, None] * h)
            if d_bias is not None:
                d_bias.index_add_(0, t, g)
        return (
            d_hidden.to(hidden.dtype) if d_hidden is not None else None,
            d_weight.to(weight.dtype) if d_weight is not None else None,
            d_bias.to(bias.dtype) if d_bias is not None else None,
            None,
            None,
            None,
            None,
        )


def chunked_target_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperatures: torch.Tensor | None = None,
    vocab_chunk: int = 8192,
    row_chunk: int = DEFAULT_ROW_CHUNK,
) -> torch.Tensor:
    """fp32 log_softmax((hidden @ weight.T + bias) / temperatures[:, None], -1)[n, targets[n]]: hidden [N, H],
    weight [V, H], temperatures [N] (None: 1) -> [N]. The distribution a token sampled at temperature T came
    from (the inference engines' processed logprobs without top-p / top-k).

    Differentiable in hidden, weight and bias; never holds more than [row_chunk, vocab_chunk] logits.
    """
    if vocab_chunk <= 0 or row_chunk <= 0:
        raise ValueError("chunk sizes must be positive")
    rows = hidden.shape[0]
    if temperatures is None:
        scale = torch.ones(rows, dtype=torch.float32, device=hidden.device)
    else:
        if temperatures.shape != (rows,) or not bool((temperatures > 0).all()):
            raise ValueError(f"temperatures must be {rows} positive values, got shape {tuple(temperatures.shape)}")
        scale = 1.0 / temperatures.to(device=hidden.device, dtype=torch.float32)
    out: torch.Tensor = _ChunkedTargetLogprob.apply(  # type: ignore[no-untyped-call]
        hidden, weight, bias, targets, scale, vocab_chunk, row_chunk
    )
    return out


def target_logprobs(
    model: torch.nn.Module,
    batch: MicroBatch,
    *,
    vocab_chunk: int = 8192,
    row_chunk: int = DEFAULT_ROW_CHUNK,
    attention_block: int | None = None,
    attention: AttentionBackend = "explicit",
) -> torch.Tensor:
    """The policy's fp32 logprob of each target of `batch`: [N] (N = len(batch.target_tokens)), differentiable.

    Sets the model's attention implementation to the tree attention (lodestar_trainer/step/attention.py) the
    first time. Raises ValueError when a target has no parent or the layout is not a pre-order forest.
    """
    if not batch.target_tokens:
        raise ValueError("micro-batch has no targets")
    head = model.lm_head
    if not isinstance(head, torch.nn.Linear | TiedHead):
        raise ValueError(f"unsupported LM head {type(head).__name__}: target_logprobs needs a linear lm_head")
    if getattr(model.config, "final_logit_softcapping", None) or getattr(model.config, "logit_scale", None):
        raise ValueError("models that scale or soft-cap their logits are not supported")
    use_tree_attention(model)
    device = head.weight.device
    parents = torch.tensor(batch.parents, dtype=torch.int64)
    targets = torch.tensor(batch.target_tokens, dtype=torch.int64)
    read_at = parents[targets]
    if bool((read_at < 0).any()):
        raise ValueError("a target token has no parent (a sampled token cannot start a sequence)")
    block = {"block": attention_block} if attention_block else {}
    input_ids = torch.tensor([batch.token_ids], dtype=torch.int64, device=device)
    position_ids = torch.tensor([batch.position_ids], dtype=torch.int64, device=device)
    base: Any = model.model
    if batch.chunk_tokens and len(batch.token_ids) > batch.chunk_tokens:
        states = _chunked_states(base, batch, input_ids, position_ids, block)
    else:
        layout: Layout = (
            FlexLayout.of(batch.parents, device=device)
            if attention == "flex"
            else TreeLayout.of(batch.parents, device=device, **block)
        )
        output = base(input_ids=input_ids, position_ids=position_ids, use_cache=False, **{LAYOUT_KWARG: layout})
        states = output.last_hidden_state[0]
    hidden = states.index_select(0, read_at.to(device))
    token_ids = input_ids[0].index_select(0, targets.to(device))
    temperatures = None
    if batch.temperatures and any(value != 1.0 for value in batch.temperatures):
        if len(batch.temperatures) != len(batch.target_tokens):
            raise ValueError(f"{len(batch.temperatures)} temperatures for {len(batch.target_tokens)} targets")
        temperatures = torch.tensor(batch.temperatures, dtype=torch.float32, device=device)
    return chunked_target_logprobs(
        hidden,
        head.weight,
        token_ids,
        bias=head.bias,
        temperatures=temperatures,
        vocab_chunk=vocab_chunk,
        row_chunk=row_chunk,
    )


def _chunked_states(
    base: Any, batch: MicroBatch, input_ids: torch.Tensor, position_ids: torch.Tensor, block: dict[str, int]
) -> torch.Tensor:
    """The base's last hidden states [T, H] of `batch`, computed in chunks of `batch.chunk_tokens` queries with
    KV reuse (module docstring)."""
    chunk, size = batch.chunk_tokens, len(batch.token_ids)
    earlier: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    states = []
    for start in range(0, size, chunk):
        stop = min(size, start + chunk)
        tree = TreeLayout.of(batch.parents[:stop], device=input_ids.device, start=start, **block)
        layout = ChunkLayout(tree, earlier, {})
        output = base(
            input_ids=input_ids[:, start:stop],
            position_ids=position_ids[:, start:stop],
            use_cache=False,
            **{LAYOUT_KWARG: layout},
        )
        states.append(output.last_hidden_state[0])
        earlier = {  # a new dict: a recompute of this chunk (activation checkpointing) reads the old one
            layer: (torch.cat((earlier[layer][0], k), 2), torch.cat((earlier[layer][1], v), 2))
            if layer in earlier
            else (k, v)
            for layer, (k, v) in layout.produced.items()
        }
    return torch.cat(states)
