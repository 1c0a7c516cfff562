"""Minimal valid requests per endpoint and the error-shape check of each dialect (shared by tests)."""

from __future__ import annotations

from typing import Any

VALID: dict[str, tuple[str, dict[str, Any]]] = {
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}),
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": "m", "input": "hi"}),
    "google": ("/v1beta/models/m:generateContent", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
}
STREAM_PATHS = {
    "anthropic": "/v1/messages",
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "google": "/v1beta/models/m:streamGenerateContent?alt=sse",
}
COUNT: dict[str, tuple[str, dict[str, Any]]] = {
    "anthropic": ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "google": ("/v1beta/models/m:countTokens", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
}


def streaming(dialect: str, body: dict[str, Any]) -> dict[str, Any]:
    """The streaming variant of a valid body (Google streams by path)."""
    return body if dialect == "google" else {**body, "stream": True}


def error_message(dialect: str, status: int, body: Any) -> str:
    """Assert `body` is `dialect`'s error shape; return its message."""
    assert isinstance(body, dict), body
    if dialect == "anthropic":
        assert body.get("type") == "error", body
        error = body["error"]
        assert isinstance(error.get("type"), str), body
    elif dialect == "google":
        error = body["error"]
        assert error.get("code") == status, body
        assert isinstance(error.get("status"), str), body
    else:
        error = body["error"]
        assert isinstance(error.get("type"), str), body
        assert "param" in error, body
        assert "code" in error, body
    message = error.get("message")
    assert isinstance(message, str), body
    assert message, body
    return message
