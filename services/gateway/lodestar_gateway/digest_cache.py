"""A bounded memo from exact bytes to a digest, for the per-call continuation keys.

Harnesses re-send the same tools and the same earlier messages on every call of a session, so the
digests the continuation lookup needs (`continuation.message_key`, `continuation.context_key`) are
memoized by the exact protobuf serialization of their input: equal bytes mean equal messages, so a hit
returns exactly what the digest function would compute (a miss only costs the computation). Bounded by
total key bytes, least recently used first out. Single-threaded use (the event loop) only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class DigestCache(Generic[V]):
    """LRU memo `key -> V` (keys: bytes or tuples of bytes), holding at most `max_bytes` of keys (keys
    larger than a tenth of it are never stored)."""

    def __init__(self, max_bytes: int) -> None:
        self._entries: OrderedDict[Hashable, tuple[int, V]] = OrderedDict()
        self._max_bytes = max_bytes
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes | tuple[bytes, ...], compute: Callable[[], V]) -> V:
        """The value for `key`, from the memo or `compute()` (whose result is then remembered)."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]
        self.misses += 1
        value = compute()
        size = len(key) if isinstance(key, bytes) else sum(len(part) for part in key)
        if size * 10 <= self._max_bytes:
            self._entries[key] = (size, value)
            self._bytes += size
            while self._bytes > self._max_bytes:
                _, (old_size, _) = self._entries.popitem(last=False)
                self._bytes -= old_size
        return value
