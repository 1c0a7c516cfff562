"""Token-faithful continuation: which earlier call of a session a new request extends.

Each captured call is a chain link: the messages it covered (its request messages plus the assistant
message it produced) and the exact token ids (prompt + sampled). A new request continues the link whose
covered messages are the LONGEST prefix of its own messages (not simply the last call: sub-agents and
parallel calls run their own chains side by side), under the same tools.

Messages are compared semantically, as the model sees them: tool-call and tool-result ids, `cache_control`
markers, client item ids and reasoning signatures play no part (they never reach the token stream);
tool-call arguments are compared as parsed JSON (harnesses re-serialize them); text is compared without
surrounding whitespace. A re-sent assistant message WITHOUT reasoning matches a captured one with
reasoning (Gemini CLI drops earlier `thought` parts); when reasoning is re-sent it must match.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from lodestar.v1 import common_pb2, inference_pb2
from services.gateway.digest_cache import DigestCache
from services.gateway.sse import dump_bytes, dumps_sorted, loads

_MESSAGE_KEYS: DigestCache[MessageKey] = DigestCache(64 * 1024 * 1024)
_CONTEXT_KEYS: DigestCache[bytes] = DigestCache(16 * 1024 * 1024)
"""Memos of the digests below by the exact serialized input (earlier messages and the tools repeat every
call of a session)."""


@dataclass(frozen=True, slots=True)
class MessageKey:
    """Digests of one message: with reasoning (`full`) and without it (`bare`)."""

    full: bytes
    bare: bytes
    has_reasoning: bool

    def matches(self, stored: MessageKey) -> bool:
        """Does this (new) message equal the stored one, as the model sees it?"""
        return self.full == stored.full if self.has_reasoning else self.bare == stored.bare


def _digest(value: object) -> bytes:
    return hashlib.blake2b(dump_bytes(value), digest_size=16).digest()


def _arguments(arguments_json: str) -> str:
    try:
        return dumps_sorted(loads(arguments_json))
    except ValueError:
        return arguments_json.strip()


def _parts(parts: Sequence[common_pb2.ContentPart]) -> tuple[list[object], list[str]]:
    visible: list[object] = []
    reasoning: list[str] = []
    for part in parts:
        kind = part.WhichOneof("part")
        if kind == "text":
            if text := part.text.text.strip():
                visible.append(text)
        elif kind == "image":
            image = part.image
            source = hashlib.blake2b(image.data).hexdigest() if image.WhichOneof("source") == "data" else image.url
            visible.append(["image", image.media_type, source])
        elif kind == "reasoning" and (text := part.reasoning.text.strip()):
            reasoning.append(text)
    return visible, reasoning


def message_key(message: common_pb2.ChatMessage) -> MessageKey:
    """The message's digests, memoized by its serialization (ChatMessage has no map fields: stable)."""
    return _MESSAGE_KEYS.get(message.SerializeToString(), lambda: _message_key(message))


def _message_key(message: common_pb2.ChatMessage) -> MessageKey:
    visible, reasoning = _parts(message.content)
    calls = [[call.name, _arguments(call.arguments_json)] for call in message.tool_calls]
    result = _parts(message.tool_result.content)[0] if message.role == common_pb2.ROLE_TOOL else None
    bare = [message.role, message.name, visible, calls, result]
    return MessageKey(full=_digest([bare, reasoning]), bare=_digest([bare, []]), has_reasoning=bool(reasoning))


def message_keys(messages: Sequence[common_pb2.ChatMessage]) -> list[MessageKey]:
    return [message_key(message) for message in messages]


def context_key(tools: Sequence[common_pb2.ToolDefinition]) -> bytes:
    """Digest of what else shapes the covered prompt: the tools (as sent; harnesses keep them
    byte-identical within a run). The thinking switch only shapes the new generation prompt."""
    # ToolDefinition has no map fields unless a Struct schema is used: plain serialization is stable.
    key = tuple(tool.SerializeToString(deterministic=tool.HasField("parameters_schema")) for tool in tools)
    return _CONTEXT_KEYS.get(key, lambda: _context_digest(key))


def _context_digest(serialized: tuple[bytes, ...]) -> bytes:
    hasher = hashlib.blake2b(digest_size=16)
    for data in serialized:
        hasher.update(len(data).to_bytes(8, "little"))
        hasher.update(data)
    return hasher.digest()


@dataclass(slots=True)
class ChainLink:
    """A captured call as a continuation source."""

    sequence: int
    context: bytes
    keys: list[MessageKey]
    """Keys of the covered messages: the request's messages, then the assistant message it produced."""
    continuation: inference_pb2.Continuation
    """Prompt ids followed by sampled ids, exactly, covering `len(keys)` messages (ready to send)."""


@dataclass(frozen=True, slots=True)
class PrefixMiss:
    """Why the closest earlier call was not continued (for the log: chain breaks are visible)."""

    sequence: int
    first_difference: int
    """Index of the first message that differs (or the covered length when the tools differ)."""
    reason: str


class ChainIndex:
    """Per-session continuation links, kept in memory for open sessions."""

    def __init__(self) -> None:
        self._links: dict[str, list[ChainLink]] = {}

    def has(self, session_id: str) -> bool:
        return session_id in self._links

    def load(self, session_id: str, links: list[ChainLink]) -> None:
        self._links[session_id] = links

    def add(self, session_id: str, link: ChainLink) -> None:
        self._links.setdefault(session_id, []).append(link)

    def drop(self, session_id: str) -> None:
        self._links.pop(session_id, None)

    def find(self, session_id: str, context: bytes, keys: Sequence[MessageKey]) -> ChainLink | PrefixMiss | None:
        """The link with the longest covered prefix of `keys` (latest on ties); else why the nearest failed."""
        best: ChainLink | None = None
        miss: PrefixMiss | None = None
        for link in reversed(self._links.get(session_id, ())):
            covered = len(link.keys)
            if covered >= len(keys) or (best is not None and covered <= len(best.keys)):
                continue
            differs = next((i for i in range(covered) if not keys[i].matches(link.keys[i])), None)
            if differs is None and link.context == context:
                best = link
                continue
            first = covered if differs is None else differs
            if miss is None or first > miss.first_difference:
                reason = "tools differ" if differs is None else "message differs"
                miss = PrefixMiss(link.sequence, first, reason)
        return best if best is not None else miss
