"""Server-sent-event framing shared by the dialects (bytes in, bytes out; no I/O)."""

from __future__ import annotations

import json
from typing import Any

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def dumps(value: Any) -> str:
    """Compact JSON text (UTF-8 safe, no ASCII escaping)."""
    return _dumps(value)


def event(name: str, payload: Any) -> bytes:
    """One `event:` + `data:` SSE frame (Anthropic and OpenAI Responses style)."""
    return f"event: {name}\ndata: {_dumps(payload)}\n\n".encode()


def data(payload: Any) -> bytes:
    """One `data:` SSE frame (OpenAI Chat and Google style)."""
    return f"data: {_dumps(payload)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
"""The OpenAI Chat end-of-stream marker."""
