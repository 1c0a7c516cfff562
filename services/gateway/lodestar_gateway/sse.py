"""JSON and server-sent-event framing shared by the dialects (bytes in, bytes out; no I/O).

JSON goes through orjson: compact, UTF-8, and faster than the stdlib on the large bodies harnesses send
(docs/benchmarks.md); the gateway's per-call overhead budget is about a millisecond.
"""

from __future__ import annotations

from typing import Any

import orjson

loads = orjson.loads
JSONDecodeError = orjson.JSONDecodeError


def dump_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON."""
    return orjson.dumps(value)


def dumps(value: Any) -> str:
    """Compact JSON text."""
    return orjson.dumps(value).decode()


def dumps_sorted(value: Any) -> str:
    """Compact JSON text with object keys sorted (canonical form for comparisons)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def event(name: str, payload: Any) -> bytes:
    """One `event:` + `data:` SSE frame (Anthropic and OpenAI Responses style)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def data(payload: Any) -> bytes:
    """One `data:` SSE frame (OpenAI Chat and Google style)."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"
"""The OpenAI Chat end-of-stream marker."""
