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

Lookups do not grow with the number of earlier calls: every link is indexed by (how many messages it
covers, the key of its last covered message), so the candidates for each prefix length are found with one
dict lookup, longest first, and a candidate is verified by comparing key lists (the keys are memoized
objects: an unchanged message is the same object, compared by identity in C). The common case, a request
extending the latest call, costs one lookup and one list comparison. Only a request that continues
nothing pays O(messages) digest work, to say how far it shares an earlier conversation (rolling digests
of every link's covered prefixes are registered when the link is added, from its parent's digest on).

A request that continues nothing is classified: DRIFT when its first difference from the closest earlier
call is one of the model's own (assistant) messages, re-sent in a form that no longer matches (a chain broke
where one was expected: matching must learn that harness's quirk); else BRANCH (the history was replaced
from a user/system message on, or the tools changed, or a turn was re-sent: compactions, sub-agents,
retries); FIRST when the session has no earlier call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from lodestar.v1 import common_pb2, inference_pb2
from lodestar.v1.common_pb2 import ChainStart
from lodestar_gateway.digest_cache import DigestCache
from lodestar_gateway.sse import dump_bytes, dumps_sorted, loads

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


def prefix_digests(keys: Sequence[MessageKey], start: int = 0, seed: bytes = b"") -> list[bytes]:
    """Rolling digests of `keys[:k]` (reasoning left out) for k = start+1 .. len(keys); `seed` is the digest
    of `keys[:start]` (b"" for start 0)."""
    digests: list[bytes] = []
    current = seed
    for key in keys[start:]:
        current = hashlib.blake2b(current + key.bare, digest_size=16).digest()
        digests.append(current)
    return digests


@dataclass(slots=True)
class ChainLink:
    """A captured call as a continuation source."""

    sequence: int
    context: bytes
    keys: list[MessageKey]
    """Keys of the covered messages: the request's messages, then the assistant message it produced."""
    continuation: inference_pb2.Continuation
    """Prompt ids followed by sampled ids, exactly, covering `len(keys)` messages (ready to send)."""
    digest: bytes = b""
    """Rolling digest of the covered messages without reasoning (`prefix_digests(keys)[-1]`), set by `add`."""


@dataclass(frozen=True, slots=True)
class ChainMatch:
    """The result of a lookup: the link to continue (if any) and how the request relates to the session."""

    link: ChainLink | None
    start: ChainStart.ValueType
    closest_sequence: int = -1
    """For BRANCH/DRIFT: the earliest call sharing the longest prefix with the request."""
    first_difference: int = 0
    """Index of the first message that differs from `closest_sequence` (its covered length when only the
    tools differ)."""
    reason: str = ""


@dataclass(slots=True)
class _Session:
    ends: dict[tuple[int, bytes], list[ChainLink]] = field(default_factory=dict)
    """(covered messages, bare key of the last one) -> links, oldest first."""
    prefixes: dict[bytes, int] = field(default_factory=dict)
    """Rolling digest of any prefix of any link's covered messages -> the first link that had it."""
    count: int = 0


def _same_prefix(keys: Sequence[MessageKey], stored: list[MessageKey]) -> bool:
    """Do the request's first len(stored) messages match the stored ones (as the model sees them)?"""
    head = keys[: len(stored)]
    return head == stored or all(new.matches(old) for new, old in zip(head, stored, strict=True))


class ChainIndex:
    """Per-session continuation links, kept in memory for open sessions (dropped when they close)."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def has(self, session_id: str) -> bool:
        return session_id in self._sessions

    def load(self, session_id: str, links: Sequence[ChainLink]) -> None:
        self._sessions[session_id] = _Session()
        for link in links:
            self.add(session_id, link)

    def add(self, session_id: str, link: ChainLink, parent: ChainLink | None = None) -> None:
        """Register a captured call; `parent`: the link its request continued (its prefix digests are reused,
        so adding costs O(new messages))."""
        state = self._sessions.setdefault(session_id, _Session())
        if not link.keys:
            return
        start, seed = (len(parent.keys), parent.digest) if parent is not None and parent.digest else (0, b"")
        digests = prefix_digests(link.keys, start, seed)
        link.digest = digests[-1] if digests else seed
        state.ends.setdefault((len(link.keys), link.keys[-1].bare), []).append(link)
        for digest in reversed(digests):
            if digest in state.prefixes:
                break
            state.prefixes[digest] = link.sequence
        state.count += 1

    def drop(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def find(
        self, session_id: str, context: bytes, keys: Sequence[MessageKey], *, roles: Sequence[int] = ()
    ) -> ChainMatch:
        """The link with the longest covered prefix of `keys` under the same tools (latest on ties); else
        how the request relates to the earlier calls. `roles`: the request messages' roles (a request
        whose first difference from the closest earlier call is an ASSISTANT message is a DRIFT)."""
        state = self._sessions.get(session_id)
        if state is None or state.count == 0:
            return ChainMatch(None, common_pb2.CHAIN_START_FIRST)
        tools_differ: ChainLink | None = None
        for covered in range(len(keys) - 1, 0, -1):
            for link in reversed(state.ends.get((covered, keys[covered - 1].bare), ())):
                if not _same_prefix(keys, link.keys):
                    continue
                if link.context == context:
                    return ChainMatch(link, common_pb2.CHAIN_START_CONTINUED)
                tools_differ = tools_differ or link
        digests = prefix_digests(keys)  # a miss (rare): how far does it share an earlier conversation?
        shared = next((k for k in range(len(keys), 0, -1) if digests[k - 1] in state.prefixes), 0)
        closest = state.prefixes[digests[shared - 1]] if shared else -1
        if tools_differ is not None and len(tools_differ.keys) >= shared:
            return ChainMatch(
                None, common_pb2.CHAIN_START_BRANCH, tools_differ.sequence, len(tools_differ.keys), "tools differ"
            )
        if shared < len(keys) and shared < len(roles) and roles[shared] == common_pb2.ROLE_ASSISTANT:
            return ChainMatch(None, common_pb2.CHAIN_START_DRIFT, closest, shared, "assistant message differs")
        reason = "turn re-sent" if shared >= len(keys) else "new conversation"
        return ChainMatch(None, common_pb2.CHAIN_START_BRANCH, closest, shared, reason)
