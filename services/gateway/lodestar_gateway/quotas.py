"""Per-session quotas on the vendor-API port: how many calls a session may make, how many at once, and how many
request bytes in all.

A session's key is handed to an untrusted agent, which can loop on model calls, open hundreds at once or send
huge bodies: without a bound, one session could starve the node's inference share, its capture store and its
disk for every other session. `SessionQuotas.admit(entry, body_bytes)` is taken around each model call;
past a limit the call is refused with ResourceExhaustedError (429 in the caller's dialect) before anything
reaches inference or the capture store. A token count (`/v1/messages/count_tokens`, Gemini's `countTokens`)
is admitted the same way and counts as a call: it reaches inference's tokenizer too. The counters live on the
session's in-memory entry (calls already captured count after a restart). A limit of 0 disables it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from lodestar.errors import ResourceExhaustedError
from lodestar_gateway.sessions import SessionEntry


@dataclass(frozen=True)
class QuotaLimits:
    max_calls: int = 0
    """Model calls one session may start (0: no limit)."""
    max_concurrent: int = 0
    """Model calls of one session in flight at once (0: no limit)."""
    max_request_bytes: int = 0
    """Request body bytes one session may send in all (0: no limit)."""


class SessionQuotas:
    def __init__(self, limits: QuotaLimits) -> None:
        self.limits = limits

    def admit(self, entry: SessionEntry, body_bytes: int) -> contextlib.AbstractContextManager[None]:
        """Count one call of `entry` (with a `body_bytes` body) now; the returned context holds its place among
        the session's calls in flight until it exits. ResourceExhaustedError when the call would pass a limit
        (then nothing is counted)."""
        limits, usage = self.limits, entry.usage
        calls = max(usage.calls, entry.next_sequence)
        if limits.max_calls and calls >= limits.max_calls:
            raise ResourceExhaustedError(f"session quota: at most {limits.max_calls} model calls per session")
        if limits.max_concurrent and usage.in_flight >= limits.max_concurrent:
            raise ResourceExhaustedError(
                f"session quota: at most {limits.max_concurrent} model calls of a session at once"
            )
        if limits.max_request_bytes and usage.request_bytes + body_bytes > limits.max_request_bytes:
            raise ResourceExhaustedError(f"session quota: at most {limits.max_request_bytes} request bytes per session")
        usage.calls, usage.request_bytes = calls + 1, usage.request_bytes + body_bytes
        usage.in_flight += 1
        return _InFlight(entry)


class _InFlight(contextlib.AbstractContextManager[None]):
    """One admitted call's place among its session's calls in flight."""

    def __init__(self, entry: SessionEntry) -> None:
        self._entry = entry

    def __exit__(self, *exc: object) -> None:
        self._entry.usage.in_flight -= 1
