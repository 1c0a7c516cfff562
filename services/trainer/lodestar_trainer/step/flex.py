"""Tree attention on CUDA with FlexAttention: the micro-batch's ancestor mask as a BlockMask, compiled.

The mask is attention.py's: in the DFS pre-order layout key k is visible to query q exactly when
k <= q < end[k] (end = the end of k's subtree), which is a document mask for packed linear sequences and
the tree mask for trees. `FlexLayout.of` builds the BlockMask straight from per-block bounds of `end`, so no
[T, T] mask is ever evaluated: for 128 x 128 tiles, a key block is *full* for a query block when every pair
is visible (it lies before the query block and every key's subtree covers the whole query block) and
*partial* when some pair may be (it does not lie after the query block and some key's subtree reaches into
it); only partial tiles evaluate the element mask, and tiles that are neither are skipped.

Compiled with `dynamic=False`: the flex kernels specialise on the sequence length, so T is padded up to a
bucket (multiples of the tile: 1, 2, 3, 4, 6, 8, 12, 16, ... tiles, two per octave) and a run of
micro-batches of varying length compiles once per bucket, not once per micro-batch; the recompile limit is
raised for these calls only. Padded keys have end 0 (never visible); padded queries see no key and are cut
off the output. Padding costs memory for the padded q/k/v/output of one attention call, not compute
(padded tiles have no blocks).

Precision: flex's kernels accumulate QK^T and PV in fp32 and keep the softmax statistics (running max, sum,
logsumexp) in fp32 for any input dtype, casting the probability tile to the input dtype for the PV matmul
as FlashAttention does.

Where it runs (torch 2.13): CUDA, forward and backward. On CPU flex attention runs forward only, eager or
compiled, and only on tensors that do not require grad ("FlexAttention does not support backward on CPU"),
so the trainer uses the explicit path there (settings `attention`); the CPU tests use the forward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from lodestar_trainer.step.attention import subtree_ends

TILE = 128
"""Tile (BlockMask block) size: flex's default and the sparsity granularity."""
RECOMPILE_LIMIT = 64
"""Compiled variants allowed for the flex call (buckets x grad modes x head shapes); dynamo's default is 8,
past which it silently falls back to eager flex attention, which materializes the [T, T] scores."""


def padded_length(size: int, tile: int = TILE) -> int:
    """The bucket `size` tokens are padded to: the smallest of 1, 2, 3, 4, 6, 8, 12, ... tiles that holds them."""
    if size <= tile:
        return tile
    bucket = 2 * tile
    while True:
        if size <= bucket:
            return bucket
        if size <= bucket * 3 // 2:
            return bucket * 3 // 2
        bucket *= 2


def _block_indices(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts [1, 1, Q], indices [1, 1, Q, K]) of the set tiles of each query block row, set ones first."""
    counts = tiles.sum(1, dtype=torch.int32)
    order = torch.argsort((~tiles).to(torch.int8), dim=1, stable=True).to(torch.int32)
    return counts[None, None].contiguous(), order[None, None].contiguous()


def tile_kinds(end: torch.Tensor, tile: int = TILE) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) boolean [Q, K] tile maps of a padded `end` ([P] int, P a multiple of `tile`, 0 on padding).

    full: kb < qb and min(end over kb) >= the query block's end; partial: kb <= qb and max(end over kb) > the
    query block's start, and not full.
    """
    blocks = end.shape[0] // tile
    ends = end.view(blocks, tile)
    index = torch.arange(blocks)
    q_start = (index * tile)[:, None]
    kb, qb = index[None, :], index[:, None]
    reach = (kb <= qb) & (ends.amax(1)[None, :] > q_start)
    full = (kb < qb) & (ends.amin(1)[None, :] >= q_start + tile)
    return reach & ~full, full


@dataclass(frozen=True)
class FlexLayout:
    """A micro-batch's BlockMask for flex attention, shared by every layer (see attention.Layout)."""

    block_mask: BlockMask
    size: int
    """Real tokens T; the mask covers `padded` >= T."""
    padded: int

    @classmethod
    def of(cls, parents: list[int], *, device: torch.device | str, tile: int = TILE) -> FlexLayout:
        """Check that `parents` is a pre-order forest (ValueError if not) and build its BlockMask on `device`."""
        size = len(parents)
        padded = padded_length(size, tile)
        end = torch.zeros(padded, dtype=torch.int32)
        end[:size] = torch.tensor(subtree_ends(parents), dtype=torch.int32)
        partial, full = tile_kinds(end, tile)
        kv_num, kv_index = _block_indices(partial)
        full_num, full_index = _block_indices(full)
        block_mask = BlockMask.from_kv_blocks(
            kv_num.to(device),
            kv_index.to(device),
            full_num.to(device),
            full_index.to(device),
            BLOCK_SIZE=tile,
            mask_mod=_ancestor_mask(end.to(device)),
            seq_lengths=(padded, padded),
        )
        return cls(block_mask, size, padded)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        return flex_tree_attention(q, k, v, self, scale)


def _ancestor_mask(end: torch.Tensor) -> Callable[..., torch.Tensor]:
    def ancestor(batch: Any, head: Any, q_index: torch.Tensor, kv_index: torch.Tensor) -> torch.Tensor:
        return (kv_index <= q_index) & (q_index < end[kv_index])

    return ancestor


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    compiled: Callable[..., torch.Tensor] = torch.compile(flex_attention, dynamic=False)
    return compiled


def _limit_name() -> str:
    """dynamo's per-function recompile limit: `recompile_limit` (torch >= 2.7), `cache_size_limit` before."""
    config: Any = torch._dynamo.config
    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


def flex_tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: FlexLayout, scale: float | None
) -> torch.Tensor:
    """Attention of q [1, Hq, T, D] over k, v [1, Hkv, T, D] (Hq a multiple of Hkv) under `layout`, compiled."""
    if q.shape[2] != layout.size:
        raise ValueError(f"layout is for {layout.size} tokens, got {q.shape[2]}")
    pad = layout.padded - layout.size
    if pad:
        q, k, v = (F.pad(tensor, (0, 0, 0, pad)) for tensor in (q, k, v))
    config: Any = torch._dynamo.config
    with config.patch(**{_limit_name(): RECOMPILE_LIMIT}):
        out = _compiled()(q, k, v, block_mask=layout.block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[:, :, : layout.size]
