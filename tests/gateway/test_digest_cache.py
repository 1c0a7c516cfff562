"""The continuation digest memo: hits return exactly the uncached digests, and the memo stays bounded."""

from __future__ import annotations

from lodestar.v1 import common_pb2
from lodestar_gateway import continuation
from lodestar_gateway.canonical import text_part
from lodestar_gateway.digest_cache import DigestCache


def test_memo_returns_computed_value_and_counts_hits() -> None:
    cache: DigestCache[str] = DigestCache(1000)
    calls: list[bytes] = []

    def compute(key: bytes) -> str:
        calls.append(key)
        return key.decode().upper()

    assert cache.get(b"ab", lambda: compute(b"ab")) == "AB"
    assert cache.get(b"ab", lambda: compute(b"ab")) == "AB"
    assert cache.get((b"a", b"b"), lambda: compute(b"a|b")) == "A|B"  # a tuple key is not the joined bytes
    assert calls == [b"ab", b"a|b"]
    assert (cache.hits, cache.misses) == (1, 2)


def test_memo_evicts_least_recently_used_by_key_bytes() -> None:
    cache: DigestCache[int] = DigestCache(100)
    for index in range(10):
        cache.get(bytes([index]) * 10, lambda index=index: index)  # type: ignore[misc]
    cache.get(bytes([0]) * 10, lambda: -1)  # refresh entry 0: entry 1 is now the oldest
    cache.get(bytes([10]) * 10, lambda: 10)
    assert len(cache) == 10
    assert cache.get(bytes([0]) * 10, lambda: -1) == 0
    assert cache.get(bytes([1]) * 10, lambda: -1) == -1  # evicted, recomputed
    assert cache.get(b"x" * 11, lambda: 7) == 7
    assert cache.get(b"x" * 11, lambda: 8) == 8  # too big: never stored


def test_memoized_keys_equal_uncached_digests() -> None:
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=[text_part("hello " * 50)])
    twin = common_pb2.ChatMessage()
    twin.CopyFrom(message)
    first = continuation.message_key(message)
    assert continuation.message_key(twin) == first == continuation._message_key(twin)
    other = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=[text_part("hello " * 49)])
    assert continuation.message_key(other) != first

    tools = [common_pb2.ToolDefinition(name=f"t{i}", description="d", parameters_json="{}") for i in range(3)]
    key = continuation.context_key(tools)
    assert continuation.context_key(list(tools)) == key
    serialized = tuple(tool.SerializeToString() for tool in tools)
    assert key == continuation._context_digest(serialized)
    assert continuation.context_key(tools[:2]) != key
    renamed = [*tools[:2], common_pb2.ToolDefinition(name="t9", description="d", parameters_json="{}")]
    assert continuation.context_key(renamed) != key
