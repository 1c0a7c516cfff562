"""A left-padded batch of KV caches for the transformers engine: join, leave, step, trim.

Every row's valid keys/values sit at the right end of a `[B, H, T, D]` tensor per layer; the padding on
the left is masked out by the 2-D attention mask and positions are given explicitly, so rows of any
length decode together in one forward pass. A joining sequence (prefilled alone) is left-padded to the
batch width (or the batch to its width); leaving rows are dropped and padding columns that every
remaining row has are trimmed.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def _layers(cache: Any) -> list[Any]:
    layers: list[Any] = cache.layers
    return layers


def cache_width(cache: Any) -> int:
    return int(_layers(cache)[0].keys.shape[-2])


def _pad_left(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    if columns == 0:
        return tensor
    shape = list(tensor.shape)
    shape[-2] = columns
    return torch.cat([tensor.new_zeros(shape), tensor], dim=-2)


class PaddedBatch:
    """The batched cache and per-row valid lengths of the sequences decoding together."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.lengths: list[int] = []

    @property
    def size(self) -> int:
        return len(self.lengths)

    def join(self, cache: Any, length: int) -> None:
        """Add a prefilled single-row cache holding `length` valid positions."""
        if self.cache is None:
            self.cache, self.lengths = cache, [length]
            return
        width, new_width = cache_width(self.cache), cache_width(cache)
        target = max(width, new_width)
        for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, target - width), _pad_left(theirs.keys, target - new_width)])
            mine.values = torch.cat(
                [_pad_left(mine.values, target - width), _pad_left(theirs.values, target - new_width)]
            )
        self.lengths.append(length)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in this order); trim padding every remaining row has."""
        if not rows:
            self.cache, self.lengths = None, []
            return
        if rows != list(range(self.size)):
            index = torch.tensor(rows, dtype=torch.long, device=_layers(self.cache)[0].keys.device)
            for layer in _layers(self.cache):
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
            self.lengths = [self.lengths[row] for row in rows]
        trim = cache_width(self.cache) - max(self.lengths)
        if trim > 0:
            for layer in _layers(self.cache):
                layer.keys = layer.keys[..., trim:, :]
                layer.values = layer.values[..., trim:, :]

    def step_inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask [B, T+1] and position ids [B, 1] for decoding one new id per row."""
        width = cache_width(self.cache) + 1
        lengths = torch.tensor(self.lengths, device=device)
        columns = torch.arange(width, device=device).unsqueeze(0)
        mask = (columns >= (width - 1 - lengths).unsqueeze(1)).to(torch.long)
        return mask, lengths.unsqueeze(1)

    def advance(self) -> None:
        """Every row gained one valid position (the forward pass appended it)."""
        self.lengths = [length + 1 for length in self.lengths]


class GrowableLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A full-attention cache layer that appends in place into spare capacity (amortized O(1) per token).

    transformers' `DynamicLayer` concatenates the whole cache on every decode step, which dominates decode
    time at long contexts. Here `keys`/`values` are views of larger buffers; when something outside
    (`PaddedBatch`) replaces `keys`/`values`, the new tensors become the buffers.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states, value_states
            self._key_buffer, self._value_buffer = key_states, value_states
            return key_states, value_states
        keys: torch.Tensor = self.keys  # type: ignore[assignment]
        values: torch.Tensor = self.values  # type: ignore[assignment]
        length = int(keys.shape[-2])
        needed = length + int(key_states.shape[-2])
        key_buffer, value_buffer = self._key_buffer, self._value_buffer
        if (
            key_buffer is None
            or value_buffer is None
            or not (self._owns(keys, key_buffer) and self._owns(values, value_buffer))
        ):
            key_buffer, value_buffer = keys, values  # replaced from outside: adopt
        if needed > key_buffer.shape[-2]:
            capacity = max(needed, 2 * length, 64)
            key_buffer, value_buffer = _grown(keys, capacity), _grown(values, capacity)
        key_buffer[..., length:needed, :] = key_states
        value_buffer[..., length:needed, :] = value_states
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self.keys = key_buffer[..., :needed, :]
        self.values = value_buffer[..., :needed, :]
        return self.keys, self.values

    @staticmethod
    def _owns(view: torch.Tensor, buffer: torch.Tensor) -> bool:
        return (
            view.data_ptr() == buffer.data_ptr()
            and view.shape[:-2] == buffer.shape[:-2]
            and view.stride() == buffer.stride()
        )


def _grown(tensor: torch.Tensor, capacity: int) -> torch.Tensor:
    shape = list(tensor.shape)
    shape[-2] = capacity
    buffer = tensor.new_empty(shape)
    buffer[..., : tensor.shape[-2], :] = tensor
    return buffer


def new_cache(config: Any) -> Any:
    """An empty cache whose layers grow in place (full-attention models)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowableLayer() for _ in cache.layers]
    return cache
