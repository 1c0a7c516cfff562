"""Tree attention for packed micro-batches: each token attends to its ancestors only, in linear memory.

A micro-batch is laid out in DFS pre-order (services/trainer/batch.py, builders/tree.py): every subtree
is a contiguous run, so key k is visible to query q exactly when k <= q < end[k], where end[k] is the end
of k's subtree. Packed linear sequences are the special case end[k] = end of k's sequence (a
block-diagonal causal mask); a lone sequence is plain causal attention.

`TreeLayout.of(parents)` checks the pre-order property and precomputes, for each block of `block` queries,
which key blocks hold any of their ancestors (block-sparse: a key block is needed when some key in it has
k < q_end and end[k] > q_start). `tree_attention` computes masked softmax attention per query block over
those keys only, with the exact element mask made on the fly, keeps only each query's logsumexp, and
recomputes each block's probabilities in the backward pass (flash-attention style at the block level).
No [T, T] mask or score matrix and no per-block copies of K/V are kept: memory beyond the inputs is
O(block * visible keys) at a time, and work is proportional to the visible key blocks.

Which attention runs where (torch 2.13): flex attention would express the same mask as a BlockMask, but
on CPU it has no backward ("FlexAttention does not support backward on CPU"); SDPA with a boolean mask
works but its CPU backward was several times slower than the explicit matmuls used here. So this
block-sparse path runs on CPU, and the same code runs on CUDA (plain matmuls, no fused kernel). A fused
flex-attention path for CUDA is not built yet.

The function is registered with transformers as the attention implementation `ATTENTION_NAME`; called
without a layout (e.g. plain generation on the same model) it falls back to the stock SDPA attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ATTENTION_NAME = "lodestar_tree"
LAYOUT_KWARG = "lodestar_layout"
DEFAULT_BLOCK = 512


@dataclass(frozen=True)
class TreeLayout:
    """The visibility structure of one micro-batch of T tokens, shared by every layer."""

    end: torch.Tensor
    """[T] int64: end (exclusive) of each token's subtree."""
    block: int
    keys: list[slice | torch.Tensor]
    """Per query block: the keys it may see, as one contiguous slice or an index tensor."""

    @classmethod
    def of(cls, parents: list[int], *, block: int = DEFAULT_BLOCK, device: torch.device | None = None) -> TreeLayout:
        """Check that `parents` is a pre-order forest and precompute the block structure.

        Raises ValueError when a token's parent is not on the path to the previous token (not pre-order).
        """
        size = len(parents)
        end = [size] * size
        path: list[int] = []
        for token, parent in enumerate(parents):
            while path and path[-1] != parent:
                end[path.pop()] = token
            if parent >= 0 and not path:
                raise ValueError(f"token {token}: parent {parent} is not an ancestor of the previous token")
            path.append(token)
        end_tensor = torch.tensor(end, dtype=torch.int64)
        blocks = (size + block - 1) // block
        block_end = torch.zeros(blocks, dtype=torch.int64)
        block_end.scatter_reduce_(0, torch.arange(size) // block, end_tensor, reduce="amax")
        keys: list[slice | torch.Tensor] = []
        for index in range(blocks):
            q_start = index * block
            needed = torch.nonzero(block_end[: index + 1] > q_start).flatten().tolist()
            keys.append(_key_span(needed, block, min(size, q_start + block)))
        if device is not None:
            end_tensor = end_tensor.to(device)
            keys = [key if isinstance(key, slice) else key.to(device) for key in keys]
        return cls(end_tensor, block, keys)


def _key_span(needed: list[int], block: int, q_end: int) -> slice | torch.Tensor:
    if needed[-1] - needed[0] + 1 == len(needed):
        return slice(needed[0] * block, min(q_end, (needed[-1] + 1) * block))
    return torch.cat([torch.arange(i * block, min(q_end, (i + 1) * block)) for i in needed])


def _key_index(key: slice | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(key, slice):
        return torch.arange(key.start, key.stop, device=device)
    return key


def _block(
    layout: TreeLayout, index: int, k: torch.Tensor, v: torch.Tensor
) -> tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query span, keys, values, mask) of query block `index`; k/v are [B, Hkv, T, D], mask [Bq, K]."""
    q_start = index * layout.block
    q_end = min(k.shape[2], q_start + layout.block)
    key = layout.keys[index]
    if isinstance(key, slice):
        k_block, v_block = k[:, :, key], v[:, :, key]
    else:
        k_block, v_block = k.index_select(2, key), v.index_select(2, key)
    k_index = _key_index(key, k.device)
    q_index = torch.arange(q_start, q_end, device=k.device)[:, None]
    mask = (k_index[None, :] <= q_index) & (q_index < layout.end[k_index][None, :])
    return slice(q_start, q_end), k_block, v_block, mask


def _scores(qb: torch.Tensor, kb: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Masked scores [B, Hkv, G, Bq, K] of grouped queries qb [B, Hkv, G, Bq, D] over keys kb [B, Hkv, K, D]."""
    return ((qb * scale) @ kb.unsqueeze(2).transpose(-1, -2)).masked_fill_(~mask, float("-inf"))


class _TreeAttention(torch.autograd.Function):
    """Masked softmax attention per query block (explicit math: on CPU, SDPA's backward with a boolean mask
    is several times slower than these matmuls), keeping only the logsumexp of each query for backward."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout, scale: float | None
    ) -> torch.Tensor:
        batch, heads, size, dim = q.shape
        groups = heads // k.shape[1]
        qg = q.view(batch, k.shape[1], groups, size, dim)
        scale = scale if scale is not None else dim**-0.5
        out = torch.empty_like(qg)
        lse = torch.empty(qg.shape[:-1], dtype=q.dtype, device=q.device)
        for index in range(len(layout.keys)):
            span, kb, vb, mask = _block(layout, index, k, v)
            scores = _scores(qg[..., span, :], kb, mask, scale)
            peak = scores.amax(-1, keepdim=True)
            weights = scores.sub_(peak).exp_()
            total = weights.sum(-1, keepdim=True)
            out[..., span, :] = (weights @ vb.unsqueeze(2)).div_(total)
            lse[..., span] = (peak + total.log()).squeeze(-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.scale = layout, scale
        return out.view(q.shape)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        layout: TreeLayout = ctx.layout
        qg, grad = q.view(out.shape), grad_out.reshape(out.shape)
        dq, dk, dv = torch.zeros_like(qg), torch.zeros_like(k), torch.zeros_like(v)
        for index, key in enumerate(layout.keys):
            span, kb, vb, mask = _block(layout, index, k, v)
            qb, gb = qg[..., span, :], grad[..., span, :]
            probabilities = _scores(qb, kb, mask, ctx.scale).sub_(lse[..., span, None]).exp_()
            gv = (probabilities.transpose(-1, -2) @ gb).sum(2)
            d_scores = (gb @ vb.unsqueeze(2).transpose(-1, -2)).sub_((gb * out[..., span, :]).sum(-1, keepdim=True))
            d_scores.mul_(probabilities)
            dq[..., span, :] = (d_scores @ kb.unsqueeze(2)).mul_(ctx.scale)
            gk = (d_scores.transpose(-1, -2) @ qb).sum(2).mul_(ctx.scale)
            if isinstance(key, slice):
                dk[:, :, key] += gk
                dv[:, :, key] += gv
            else:
                dk.index_add_(2, key, gk)
                dv.index_add_(2, key, gv)
        return dq.view(q.shape), dk, dv, None, None


def tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout, scale: float | None
) -> torch.Tensor:
    """Attention of q [B, Hq, T, D] over k, v [B, Hkv, T, D] (Hq a multiple of Hkv) under `layout`."""
    out: torch.Tensor = _TreeAttention.apply(q, k, v, layout, scale)  # type: ignore[no-untyped-call]
    return out


def transformers_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The transformers attention-interface entry: tree attention when a layout is passed, else stock SDPA."""
    layout = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        output: tuple[torch.Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        return output
    if kwargs.get("sliding_window") is not None:
        raise ValueError("tree attention does not support sliding-window layers")
    if dropout:
        raise ValueError("tree attention does not support attention dropout")
    return tree_attention(query, key, value, layout, scaling).transpose(1, 2).contiguous(), None


def use_tree_attention(model: torch.nn.Module) -> None:
    """Register the tree attention with transformers and make `model` use it (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, transformers_attention)
    if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
        model.set_attn_implementation(ATTENTION_NAME)  # type: ignore[operator]
