"""The served model's tokenizer, chat template source and end-of-turn ids, read from a model directory.

Uses the `tokenizers` library directly (no transformers import): `tokenizer.json` for the vocabulary,
`tokenizer_config.json` / `chat_template.jinja` for the template and special tokens, `generation_config.json`
and `config.json` for the ids that end a turn. `IncrementalDecoder` turns a growing list of sampled ids
into text without ever emitting half of a multi-byte character.

Harness prompts repeat tens of kilobytes (system prompt, tool schemas, history) on every call, and encoding
them whole each time costs tens of milliseconds (docs/benchmarks.md). For byte-level BPE tokenizers without
a normalizer, text on the two sides of
a special token is tokenized independently, so `encode` splits the text at special tokens and caches the
ids of each segment (bounded LRU): only new turns are encoded again.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from lodestar.errors import InvalidArgumentError


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, int)]
    return []


class _SegmentCache:
    """Ids of text segments, least recently used dropped past `max_chars` of cached text."""

    def __init__(self, max_chars: int = 16_000_000) -> None:
        self._entries: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._max_chars = max_chars
        self._lock = threading.Lock()

    def get(self, segment: str) -> list[int] | None:
        with self._lock:
            ids = self._entries.get(segment)
            if ids is not None:
                self._entries.move_to_end(segment)
            return ids

    def put(self, segment: str, ids: list[int]) -> None:
        with self._lock:
            if segment in self._entries or len(segment) > self._max_chars // 4:
                return
            self._entries[segment] = ids
            self._chars += len(segment)
            while self._chars > self._max_chars:
                old, _ = self._entries.popitem(last=False)
                self._chars -= len(old)


def _segment_pattern(tokenizer: Tokenizer) -> re.Pattern[str] | None:
    """Splits text before each special token, when that cannot change the ids (byte-level BPE only)."""
    spec = json.loads(tokenizer.to_str())
    pre = json.dumps(spec.get("pre_tokenizer"))
    if spec.get("normalizer") is not None or "ByteLevel" not in pre or '"add_prefix_space": true' in pre:
        return None
    specials = [token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special]
    if not specials:
        return None
    return re.compile("(?=" + "|".join(re.escape(text) for text in sorted(specials, key=len, reverse=True)) + ")")


@dataclass(frozen=True)
class TextTokenizer:
    """A model's tokenizer plus what the chat template and the stop logic need."""

    tokenizer: Tokenizer
    chat_template: str
    special_tokens: dict[str, str]
    """Template variables such as bos_token / eos_token (token texts)."""
    eos_token_ids: tuple[int, ...]
    segments: re.Pattern[str] | None = None
    """Where `encode` may split text (before special tokens); None: always encode whole."""
    _cache: _SegmentCache = field(default_factory=_SegmentCache, repr=False, compare=False)

    @classmethod
    def load(cls, model_dir: Path) -> TextTokenizer:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise InvalidArgumentError(f"model directory {model_dir} has no tokenizer.json")
        tokenizer = Tokenizer.from_file(str(path))
        config = _read_json(model_dir / "tokenizer_config.json")
        template_file = model_dir / "chat_template.jinja"
        template = template_file.read_text() if template_file.is_file() else config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((item["template"] for item in template if item.get("name") == "default"), None)
        if not isinstance(template, str) or not template:
            raise InvalidArgumentError(f"model directory {model_dir} has no chat template")
        special = {
            key: text
            for key in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (text := _token_text(config.get(key))) is not None
        }
        eos: list[int] = _ids(_read_json(model_dir / "generation_config.json").get("eos_token_id"))
        eos += _ids(_read_json(model_dir / "config.json").get("eos_token_id"))
        if "eos_token" in special and (eos_id := tokenizer.token_to_id(special["eos_token"])) is not None:
            eos.append(eos_id)
        if not eos:
            raise InvalidArgumentError(f"model directory {model_dir} names no end-of-turn token")
        return cls(tokenizer, template, special, tuple(dict.fromkeys(eos)), _segment_pattern(tokenizer))

    @property
    def vocab_size(self) -> int:
        size: int = self.tokenizer.get_vocab_size(with_added_tokens=True)
        return size

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; special-token texts inside it become their single ids; nothing is added."""
        if self.segments is None:
            return self._encode(text)
        ids: list[int] = []
        for segment in self.segments.split(text):
            if not segment:
                continue
            cached = self._cache.get(segment)
            if cached is None:
                cached = self._encode(segment)
                self._cache.put(segment, cached)
            ids.extend(cached)
        return ids

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def token_id(self, text: str) -> int | None:
        token: int | None = self.tokenizer.token_to_id(text)
        return token


_DECODE_CONTEXT = 4
"""Ids decoded again before the new ones, for context (a character split across ids, a leading space)."""


class IncrementalDecoder:
    """Decodes a growing id list; `text` only ever grows, never ends in a partial character.

    Constant work per id: each `add` decodes the new ids plus at most `_DECODE_CONTEXT` ids before them
    (and the ids of a character still incomplete), however long the text and however many ids came at once.
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def add(self, ids: Sequence[int]) -> str:
        """Append sampled ids; return the new text (may be empty while a character is incomplete)."""
        self._ids.extend(ids)
        prefix = self._decode_prefix()
        full = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        new = full[len(prefix) :]
        self._prefix_offset = max(self._read_offset, len(self._ids) - _DECODE_CONTEXT)
        self._read_offset = len(self._ids)
        self.text += new
        return new

    def flush(self) -> str:
        """At the end: whatever is left, replacement characters included."""
        if self._read_offset == len(self._ids):  # every id is in `text` already
            return ""
        full = self._tokenizer.decode(self._ids[self._prefix_offset :])
        prefix = self._decode_prefix()
        new = full[len(prefix) :] if full.startswith(prefix) else ""
        self._read_offset = len(self._ids)
        self.text += new
        return new

    def _decode_prefix(self) -> str:
        """The context ids' text (none before the first id is read: a whole reply decoded at once costs one
        decode, not two)."""
        if self._prefix_offset == self._read_offset:
            return ""
        return self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
