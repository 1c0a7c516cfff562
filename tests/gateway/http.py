"""A minimal raw HTTP client (stdlib http.client) for tests that check exact bytes, statuses and timing."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _connection(base_url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)


def request(
    base_url: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = 30.0,
) -> Reply:
    """One request; `body` is JSON-encoded unless `raw` bytes are given. `key` goes in x-api-key."""
    all_headers = {"Content-Type": "application/json"}
    if key is not None:
        all_headers["x-api-key"] = key
    all_headers.update(headers or {})
    payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    connection = _connection(base_url, timeout)
    try:
        connection.request(method, path, body=payload, headers=all_headers)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def post(base_url: str, path: str, body: Any = None, **options: Any) -> Reply:
    return request(base_url, "POST", path, body, **options)


@dataclass
class SseEvent:
    event: str | None
    data: str
    at: float
    """Seconds since the request was sent."""

    def json(self) -> Any:
        return json.loads(self.data)


def sse(base_url: str, path: str, body: Any, *, key: str, timeout: float = 30.0) -> Iterator[SseEvent]:
    """POST and yield SSE events as they arrive (raises AssertionError on a non-200 status)."""
    connection = _connection(base_url, timeout)
    started = time.perf_counter()
    try:
        connection.request(
            "POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json", "x-api-key": key}
        )
        response = connection.getresponse()
        assert response.status == 200, (response.status, response.read())
        assert response.getheader("Content-Type", "").startswith("text/event-stream")
        event: str | None = None
        data: list[str] = []
        while line := response.readline():
            text = line.decode().rstrip("\r\n")
            if text.startswith("event:"):
                event = text[6:].strip()
            elif text.startswith("data:"):
                data.append(text[5:].strip())
            elif not text and data:
                yield SseEvent(event, "\n".join(data), time.perf_counter() - started)
                event, data = None, []
    finally:
        connection.close()
