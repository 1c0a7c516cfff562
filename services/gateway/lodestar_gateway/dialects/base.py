"""What every dialect adapter provides: parse / render / render-stream / render-error.

A dialect module owns one vendor wire format. It never does I/O: `parse` turns a decoded JSON body into
a `CanonicalRequest`, `render` turns a `CallResult` into the non-streaming JSON body, `stream` returns a
`StreamRenderer` that turns inference deltas into the vendor's exact event bytes, and `error` turns a
domain error into (HTTP status, JSON body) in the vendor's error shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from lodestar.errors import LodestarError
from lodestar.v1 import common_pb2, inference_pb2
from lodestar_gateway.canonical import CallResult, CanonicalRequest

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Route:
    """What the URL (not the body) says about a request."""

    model: str | None = None
    """Model named in the path (Google)."""
    stream: bool = False
    """The path asks for a stream (Google `:streamGenerateContent`)."""
    sse: bool = True
    """Google streams: SSE (`alt=sse`) or one JSON array."""


class StreamRenderer(Protocol):
    """Turns one generation into the dialect's event stream."""

    content_type: str

    def start(self, response_id: str, created: int) -> bytes:
        """Events that open the stream (sent together with the first delta)."""
        ...

    def delta(self, delta: inference_pb2.GenerateDelta) -> bytes:
        """Events for newly generated text, reasoning or tool calls (may be empty)."""
        ...

    def finish(self, result: CallResult) -> bytes:
        """Events that close the stream (stop reason, usage, terminator)."""
        ...

    def error(self, error: LodestarError) -> bytes:
        """An in-stream error event, for failures after the stream has started."""
        ...


class DialectAdapter(Protocol):
    """One vendor API."""

    dialect: common_pb2.Dialect.ValueType
    name: str

    def parse(self, body: Any, route: Route, *, count_tokens: bool = False) -> CanonicalRequest:
        """Validate and normalize a decoded JSON body; raises InvalidArgumentError naming the field.
        `count_tokens`: the body is a token-counting request (no sampling fields)."""
        ...

    def render(self, request: CanonicalRequest, result: CallResult) -> JsonObject:
        """The non-streaming response body."""
        ...

    def stream(self, request: CanonicalRequest) -> StreamRenderer:
        """A renderer for one streamed response."""
        ...

    def error(self, error: LodestarError) -> tuple[int, JsonObject]:
        """HTTP status and body for an error, in the vendor's error shape."""
        ...
