"""Sessions of a gateway node: the API key a harness sends IS the session key.

Sessions are created only by `open` (GatewayService.OpenSession, or the node lifecycle), persisted in the
capture store before the key is handed out, and reloaded on restart. An unknown, missing or closed key is
refused with UnauthenticatedError (401 in the caller's dialect).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from lodestar.errors import NotFoundError, UnauthenticatedError
from lodestar.sampling import resolved_policy
from lodestar.v1 import common_pb2, gateway_pb2
from lodestar_gateway.capture import CaptureStore

KEY_PREFIX = "lsk-"


@dataclass
class SessionUsage:
    """What a session has used of its quotas (services/gateway/lodestar_gateway/quotas.py), in memory."""

    calls: int = 0
    """Model calls started (answered or not)."""
    in_flight: int = 0
    request_bytes: int = 0


@dataclass
class SessionEntry:
    """A session, its capture counter and its quota usage."""

    session: gateway_pb2.Session
    next_sequence: int = 0
    usage: SessionUsage = field(default_factory=SessionUsage)

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def is_open(self) -> bool:
        return self.session.state == gateway_pb2.SESSION_STATE_OPEN

    def take_sequence(self) -> int:
        """The next sequence number (calls are numbered in the order they are captured)."""
        sequence = self.next_sequence
        self.next_sequence += 1
        self.session.call_count = self.next_sequence
        return sequence


def timestamp_now() -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(time.time_ns())
    return stamp


class SessionRegistry:
    """The sessions of this node, by id and by key: open ones in memory, the most recently closed ones in a
    bounded memo (so a closed key is answered "closed"), all of them in the capture store. A node's memory
    therefore stays flat however many sessions it has opened and closed."""

    def __init__(self, store: CaptureStore, *, closed_memo: int = 1024) -> None:
        self._store = store
        self._by_id: dict[str, SessionEntry] = {}
        self._by_key: dict[str, SessionEntry] = {}
        self._closed: OrderedDict[str, SessionEntry] = OrderedDict()
        """Recently closed sessions by id AND by key (two entries each)."""
        self._closed_memo = closed_memo

    async def load(self) -> None:
        for session, count in await self._store.sessions():
            session.call_count = count
            if session.state == gateway_pb2.SESSION_STATE_OPEN:
                self._index(SessionEntry(session, count))

    def _index(self, entry: SessionEntry) -> None:
        self._by_id[entry.session_id] = entry
        self._by_key[entry.session.session_key] = entry

    def _retire(self, entry: SessionEntry) -> None:
        self._by_id.pop(entry.session_id, None)
        self._by_key.pop(entry.session.session_key, None)
        self._closed[entry.session_id] = self._closed[entry.session.session_key] = entry
        while len(self._closed) > 2 * self._closed_memo:
            self._closed.popitem(last=False)

    def __len__(self) -> int:
        """Sessions held in memory (open + the closed memo)."""
        return len(self._by_id) + len(self._closed) // 2

    async def open(
        self,
        *,
        run_id: str = "",
        labels: Mapping[str, str] | None = None,
        sampling_policy: common_pb2.SamplingPolicy | None = None,
    ) -> SessionEntry:
        """A new open session (persisted before its key is returned). `sampling_policy`, resolved to explicit
        values, is enforced on its calls; None: its calls sample as their client asks."""
        session = gateway_pb2.Session(
            session_id=f"ses_{secrets.token_hex(8)}",
            session_key=KEY_PREFIX + secrets.token_urlsafe(24),
            state=gateway_pb2.SESSION_STATE_OPEN,
            run_id=run_id,
            labels=dict(labels or {}),
            opened_at=timestamp_now(),
        )
        if sampling_policy is not None:
            session.sampling_policy.CopyFrom(resolved_policy(sampling_policy))
        await self._store.put_session(session)
        entry = SessionEntry(session)
        self._index(entry)
        return entry

    async def close_orphans(self, label: str) -> list[str]:
        """Close every open session labelled `label` (sessions a node's lifecycle opened: after a restart their
        attempts are gone, so their keys must stop working). Returns their ids."""
        orphans = [entry.session_id for entry in list(self._by_id.values()) if label in entry.session.labels]
        for session_id in orphans:
            await self.close(session_id)
        return orphans

    async def close(self, session_id: str) -> SessionEntry:
        entry = await self.find(session_id)
        if entry.is_open:
            closed = gateway_pb2.Session()
            closed.CopyFrom(entry.session)
            closed.state = gateway_pb2.SESSION_STATE_CLOSED
            closed.closed_at.CopyFrom(timestamp_now())
            await self._store.put_session(closed)
            entry.session = closed
            self._retire(entry)
        return entry

    def forget(self, session_ids: Iterable[str]) -> None:
        """Drop deleted (pruned) sessions from the memo of closed ones."""
        for session_id in session_ids:
            entry = self._closed.pop(session_id, None)
            if entry is not None:
                self._closed.pop(entry.session.session_key, None)

    def get(self, session_id: str) -> SessionEntry:
        """An open or recently closed session (see `find` for any session)."""
        entry = self._by_id.get(session_id) or self._closed.get(session_id)
        if entry is None:
            raise NotFoundError(f"unknown session {session_id!r}")
        return entry

    async def find(self, id_or_key: str) -> SessionEntry:
        """Any session of this node by its id or its key (the store answers for long-closed ones)."""
        entry = self._by_id.get(id_or_key) or self._by_key.get(id_or_key) or self._closed.get(id_or_key)
        if entry is not None:
            return entry
        found = await self._store.session(id_or_key)
        if found is None:
            raise NotFoundError(f"unknown session {id_or_key!r}")
        session, count = found
        session.call_count = count
        return SessionEntry(session, count)

    def authenticate(self, key: str | None) -> SessionEntry:
        """The open session whose key this is."""
        if not key:
            raise UnauthenticatedError("missing API key: send the lodestar session key as the API key")
        entry = self._by_key.get(key) or self._closed.get(key)
        if entry is None:
            raise UnauthenticatedError("invalid API key: not a session key of this gateway")
        if not entry.is_open:
            raise UnauthenticatedError(f"session {entry.session_id} is closed")
        return entry

    @property
    def open_count(self) -> int:
        return len(self._by_id)
