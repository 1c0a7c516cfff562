"""Tree attention for packed micro-batches: each token attends to its ancestors only, in linear memory.

A micro-batch is laid out in DFS pre-order (lodestar_trainer/data/batch.py, builders/tree.py): every subtree
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

Precision: the block math runs in fp32 whatever the compute dtype (bf16 q/k/v are upcast one block at a
time): scores, running max, sum, logsumexp and the probabilities of the backward pass are fp32, and only the
output and the input gradients are cast back. bf16 scores would round a score of 20 by up to 0.06, i.e. 6% on
its probability.

Which attention runs where (settings `attention`): on CUDA the fused FlexAttention path of
lodestar_trainer/step/flex.py (same mask as a BlockMask, compiled); this explicit path on CPU, where flex
attention has no backward in torch 2.13 ("FlexAttention does not support backward on CPU") and SDPA with a
boolean mask was several times slower in backward than the explicit matmuls used here. The explicit path
also runs on CUDA when asked for (plain matmuls, no fused kernel).

The function is registered with transformers as the attention implementation `ATTENTION_NAME`; called
without a layout (e.g. plain generation on the same model) it falls back to the stock SDPA attention. A
layout is anything with `attend(q, k, v, scale)`: `TreeLayout` here, `FlexLayout` in flex.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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
    offset: int = 0
    """The queries are tokens offset..T-1 (the keys all T): a chunk over the earlier chunks' keys and values."""

    @classmethod
    def of(
        cls, parents: list[int], *, block: int = DEFAULT_BLOCK, device: torch.device | None = None, start: int = 0
    ) -> TreeLayout:
        """Check that `parents` is a pre-order forest and precompute the block structure for the queries from
        token `start` on (keys: every token).

        Raises ValueError when a token's parent is not on the path to the previous token (not pre-order).
        """
        size = len(parents)
        end = subtree_ends(parents)
        end_tensor = torch.tensor(end, dtype=torch.int64)
        blocks = (size + block - 1) // block
        block_end = torch.zeros(blocks, dtype=torch.int64)
        block_end.scatter_reduce_(0, torch.arange(size) // block, end_tensor, reduce="amax")
        keys: list[slice | torch.Tensor] = []
        for q_start in range(start, size, block):
            q_end = min(size, q_start + block)
            needed = torch.nonzero(block_end[: (q_end - 1) // block + 1] > q_start).flatten().tolist()
            keys.append(_key_span(needed, block, q_end))
        if device is not None:
            end_tensor = end_tensor.to(device)
            keys = [key if isinstance(key, slice) else key.to(device) for key in keys]
        return cls(end_tensor, block, keys, start)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        return tree_attention(q, k, v, self, scale)


class Layout(Protocol):
    """A micro-batch's attention structure, built once per forward pass and shared by every layer."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        """Attention of q [B, Hq, T, D] over k, v [B, Hkv, T, D] -> [B, Hq, T, D]."""
        ...


def subtree_ends(parents: list[int]) -> list[int]:
    """End (exclusive) of each token's subtree in a pre-order forest: key k is visible to query q exactly when
    k <= q < end[k]. Raises ValueError when a token's parent is not on the path to the previous token."""
    size = len(parents)
    end = [size] * size
    path: list[int] = []
    for token, parent in enumerate(parents):
        while path and path[-1] != parent:
            end[path.pop()] = token
        if parent >= 0 and not path:
            raise ValueError(f"token {token}: parent {parent} is not an ancestor of the previous token")
        path.append(token)
    return end


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
    """(query span in q, keys, values, mask) of query block `index`; k/v are [B, Hkv, T, D], mask [Bq, K]."""
    q_start = layout.offset + index * layout.block
    q_end = min(k.shape[2], q_start + layout.block)
    key = layout.keys[index]
    if isinstance(key, slice):
        k_block, v_block = k[:, :, key], v[:, :, key]
    else:
        k_block, v_block = k.index_select(2, key), v.index_select(2, key)
    k_index = _key_index(key, k.device)
    q_index = torch.arange(q_start, q_end, device=k.device)[:, None]
    mask = (k_index[None, :] <= q_index) & (q_index < layout.end[k_index][None, :])
    return slice(q_start - layout.offset, q_end - layout.offset), k_block, v_block, mask


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in at least fp32 (bf16/fp16 upcast; fp32 and fp64 as they are, without a copy)."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def _scores(qb: torch.Tensor, kb: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Masked scores [B, Hkv, G, Bq, K] of grouped queries qb [B, Hkv, G, Bq, D] over keys kb [B, Hkv, K, D]."""
    return ((qb * scale) @ kb.unsqueeze(2).transpose(-1, -2)).masked_fill_(~mask, float("-inf"))


class _TreeAttention(torch.autograd.Function):
    """Masked softmax attention per query block (explicit math: on CPU, SDPA's backward with a boolean mask
    is several times slower than these matmuls), keeping the fp32 logsumexp of each query and the fp32
    output for backward (its dO . O term: from the output rounded to bf16 it would carry bf16's error, and
    summing P dP over the keys instead costs a pass over every score block). Block math in fp32 (fp64 stays
    fp64; no copy for either); outputs and gradients in the inputs' dtypes."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout, scale: float | None
    ) -> torch.Tensor:
        batch, heads, size, dim = q.shape
        groups = heads // k.shape[1]
        qg = q.view(batch, k.shape[1], groups, size, dim)
        scale = scale if scale is not None else dim**-0.5
        wide = torch.promote_types(q.dtype, torch.float32)
        out = torch.empty(qg.shape, dtype=wide, device=q.device)  # fp32 for bf16 inputs: kept for backward
        lse = torch.empty(qg.shape[:-1], dtype=wide, device=q.device)
        for index in range(len(layout.keys)):
            span, kb, vb, mask = _block(layout, index, k, v)
            scores = _scores(_wide(qg[..., span, :]), _wide(kb), mask, scale)
            peak = scores.amax(-1, keepdim=True)
            weights = scores.sub_(peak).exp_()
            total = weights.sum(-1, keepdim=True)
            out[..., span, :] = (weights @ _wide(vb).unsqueeze(2)).div_(total)
            lse[..., span] = (peak + total.log()).squeeze(-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.scale = layout, scale
        return out.view(q.shape).to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        layout: TreeLayout = ctx.layout
        grouped = (*lse.shape, q.shape[-1])  # [B, Hkv, G, T, D]
        qg, grad = q.view(grouped), grad_out.reshape(grouped)
        dq = torch.zeros(grouped, dtype=lse.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=lse.dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=lse.dtype, device=v.device)
        for index, key in enumerate(layout.keys):
            span, kb, vb, mask = _block(layout, index, k, v)
            kb, vb = _wide(kb), _wide(vb)
            qb, gb = _wide(qg[..., span, :]), _wide(grad[..., span, :])
            probabilities = _scores(qb, kb, mask, ctx.scale).sub_(lse[..., span, None]).exp_()
            gv = (probabilities.transpose(-1, -2) @ gb).sum(2)
            row = (gb * out[..., span, :]).sum(-1, keepdim=True)  # dO . O = sum_k P dP, per query
            d_scores = (gb @ vb.unsqueeze(2).transpose(-1, -2)).sub_(row).mul_(probabilities)
            dq[..., span, :] = (d_scores @ kb.unsqueeze(2)).mul_(ctx.scale)
            gk = (d_scores.transpose(-1, -2) @ qb).sum(2).mul_(ctx.scale)
            if isinstance(key, slice):
                dk[:, :, key] += gk
                dv[:, :, key] += gv
            else:
                dk.index_add_(2, key, gk)
                dv.index_add_(2, key, gv)
        return dq.view(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


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
    if isinstance(layout, ChunkLayout):
        attended = layout.attend_layer(int(getattr(module, "layer_idx", 0)), query, key, value, scaling)
    else:
        attended = layout.attend(query, key, value, scaling)
    return attended.transpose(1, 2).contiguous(), None


@dataclass(frozen=True)
class ChunkLayout:
    """One chunk of a micro-batch longer than its chunk size (KV reuse, forward.py): the chunk's queries attend to
    the keys and values the earlier chunks computed, per layer, and to its own; the chunk's own are recorded for
    the next chunk. The earlier ones stay in the autograd graph, so the gradient flows back into the chunks that
    made them and equals the one-pass gradient."""

    tree: TreeLayout
    """The chunk's queries (offset = the earlier chunks' tokens) over every key so far."""
    earlier: dict[int, tuple[torch.Tensor, torch.Tensor]]
    """Per layer: the earlier chunks' keys and values [B, Hkv, offset, D] (never changed once made)."""
    produced: dict[int, tuple[torch.Tensor, torch.Tensor]]
    """Per layer: this chunk's keys and values, filled by the forward pass."""

    def attend_layer(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
    ) -> torch.Tensor:
        self.produced[layer] = (k, v)
        if layer in self.earlier:
            before_k, before_v = self.earlier[layer]
            k, v = torch.cat((before_k, k), 2), torch.cat((before_v, v), 2)
        return tree_attention(q, k, v, self.tree, scale)


def use_tree_attention(model: torch.nn.Module) -> None:
    """Register the tree attention with transformers and make `model` use it (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, transformers_attention)
    if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
        model.set_attn_implementation(ATTENTION_NAME)  # type: ignore[operator]
