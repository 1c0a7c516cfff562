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

Compiled before the first step: `warm_up` runs every bucket a micro-batch of the token budget can fall in,
with the model's head shapes and compute dtype, forward and backward (and without grad when a KL reference
model runs), at start-up; a compile then never stalls a step (20-40 s each on a GPU, on every rank). A budget
whose buckets would pass the recompile limit is refused there, and past the limit the call raises instead of
falling back to eager flex attention (which materializes the [T, T] scores).

Precision: flex's kernels accumulate QK^T and PV in fp32 and keep the softmax statistics (running max, sum,
logsumexp) in fp32 for any input dtype, casting the probability tile to the input dtype for the PV matmul
as FlashAttention does.

Where it runs (torch 2.13): CUDA, forward and backward. On CPU flex attention runs forward only, eager or
compiled, and only on tensors that do not require grad ("FlexAttention does not support backward on CPU"),
so the trainer uses the explicit path there (settings `attention`); the CPU tests use the forward.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from lodestar.errors import InvalidArgumentError
from lodestar.logging import get_logger
from lodestar_trainer.step.attention import subtree_ends

_log = get_logger("trainer")

TILE = 128
"""Tile (BlockMask block) size: flex's default and the sparsity granularity."""
RECOMPILE_LIMIT = 64
"""Compiled variants allowed for the flex call (buckets x grad modes x head shapes); dynamo's default is 8,
past which it silently falls back to eager flex attention, which materializes the [T, T] scores."""
RUNTIME_HEADROOM = 8
"""Variants left after the warm-up for lengths it could not foresee (a part over the budget)."""


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


def _limits() -> dict[str, Any]:
    """dynamo's per-function recompile limit raised to RECOMPILE_LIMIT, and an error instead of the eager fallback
    past it (the names since torch 2.7, and before)."""
    config: Any = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    fails = [name for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit") if hasattr(config, name)]
    return {limit: RECOMPILE_LIMIT, **({fails[0]: True} if fails else {})}


def flex_tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: FlexLayout, scale: float | None
) -> torch.Tensor:
    """Attention of q [1, Hq, T, D] over k, v [1, Hkv, T, D] (Hq a multiple of Hkv) under `layout`, compiled."""
    if q.shape[2] != layout.size:
        raise ValueError(f"layout is for {layout.size} tokens, got {q.shape[2]}")
    pad = layout.padded - layout.size
    # contiguous either way: the compiled call is guarded on strides, and the warm-up's tensors are contiguous
    q, k, v = (F.pad(tensor, (0, 0, 0, pad)) if pad else tensor.contiguous() for tensor in (q, k, v))
    config: Any = torch._dynamo.config
    with config.patch(**_limits()):
        out = _compiled()(q, k, v, block_mask=layout.block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[:, :, : layout.size]


def buckets(budget: int, tile: int = TILE) -> list[int]:
    """Every padded length a micro-batch of at most `budget` tokens can have, shortest first."""
    top, out = padded_length(budget, tile), [tile]
    while out[-1] < top:
        out.append(padded_length(out[-1] + 1, tile))
    return out


@dataclass(frozen=True)
class AttentionShape:
    """What the compiled flex call is specialised on besides the length: heads, head size, scale."""

    heads: int
    kv_heads: int
    head_dim: int
    scale: float

    @classmethod
    def of(cls, model: Any) -> AttentionShape:
        """The shape of a transformers causal LM's attention (its first layer's `scaling`, else head_dim^-0.5)."""
        config = model.config
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        layer = model.model.layers[0].self_attn
        scale = float(getattr(layer, "scaling", head_dim**-0.5))
        return cls(heads, int(getattr(config, "num_key_value_heads", None) or heads), head_dim, scale)


def warm_up(
    shape: AttentionShape,
    *,
    budget: int,
    device: torch.device | str,
    dtype: torch.dtype,
    grad_modes: tuple[bool, ...] = (True,),
) -> int:
    """Compile the flex call for every bucket of `budget` in each of `grad_modes` (True: forward and backward, as
    training runs it; False: forward under no_grad, as the KL reference runs it); the variants compiled.
    InvalidArgumentError, before compiling anything, when they would leave less than RUNTIME_HEADROOM of the
    recompile limit."""
    sizes = buckets(budget)
    variants = len(sizes) * len(grad_modes)
    if variants > RECOMPILE_LIMIT - RUNTIME_HEADROOM:
        raise InvalidArgumentError(
            f"a token budget of {budget} needs {variants} compiled flex attention variants, over the "
            f"{RECOMPILE_LIMIT - RUNTIME_HEADROOM} the recompile limit allows: lower batch.micro_batch_tokens"
        )
    for size in sizes:
        layout = FlexLayout.of(list(range(-1, size - 1)), device=device)  # a chain of exactly the bucket's size
        for grad in grad_modes:
            q, k, v = (
                torch.randn(1, heads, size, shape.head_dim, device=device, dtype=dtype, requires_grad=grad)
                for heads in (shape.heads, shape.kv_heads, shape.kv_heads)
            )
            with torch.set_grad_enabled(grad):
                out = flex_tree_attention(q, k, v, layout, shape.scale)
                if grad:
                    torch.autograd.backward(out.sum())
    return variants


def warm_up_model(model: Any, *, budget: int, device: str, dtype: torch.dtype, reference: bool) -> None:
    """`warm_up` for `model`'s attention at the trainer's start: training's grad mode, and no_grad too when a KL
    `reference` model runs; logs how long the compiles took."""
    start = time.monotonic()
    modes = (True, False) if reference else (True,)
    variants = warm_up(AttentionShape.of(model), budget=budget, device=device, dtype=dtype, grad_modes=modes)
    _log.info("flex attention compiled", variants=variants, budget=budget, seconds=round(time.monotonic() - start, 1))
