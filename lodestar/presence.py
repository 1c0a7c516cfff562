"""What live processes announce in etcd, and how it is read back: gateway nodes (`<prefix>nodes/<id>`,
lodestar_gateway/membership.py) and inference replicas (`<prefix>inference/<id>`, inference_registry.py).

Each announces a `JsonRecord` (a frozen dataclass of str, int and datetime fields, one JSON object) under
its own key in its kind's directory, written by a `lodestar.leased_key.LeasedKey`. Readers list the
directory and decode each value; a value that is not a record of the kind is logged and skipped (another
version's writer, a hand-written key), never fatal to the reader.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from typing import Any, ClassVar, Self, TypeVar, cast, get_type_hints

from lodestar import errors
from lodestar.logging import get_logger

DEFAULT_PREFIX = "/lodestar/"
_log = get_logger("etcd.presence")


def directory(prefix: str, name: str) -> str:
    """Where the keys of one kind live: `<prefix><name>/`."""
    return f"{prefix.rstrip('/')}/{name}/"


def member_key(prefix: str, name: str, member_id: str, what: str) -> str:
    """`<prefix><name>/<member_id>`; InvalidArgumentError for an empty id or one with a '/'."""
    if not member_id or "/" in member_id:
        raise errors.InvalidArgumentError(f"{what} id must be non-empty and without '/', got {member_id!r}")
    return directory(prefix, name) + member_id


_DECODERS: dict[Any, Callable[[Any], Any]] = {
    str: str,
    int: int,
    datetime: lambda value: datetime.fromisoformat(str(value)),
}


@cache
def _decoders(record_type: type) -> dict[str, Callable[[Any], Any]]:
    """Each field's decoder by name (a field of another type is a bug of the record: KeyError at once)."""
    hints = get_type_hints(record_type)
    return {field.name: _DECODERS[hints[field.name]] for field in dataclasses.fields(record_type)}


class JsonRecord:
    """A frozen dataclass announced as one JSON object (datetimes in ISO 8601, UTC); `kind` names it in
    errors ("node", "replica")."""

    kind: ClassVar[str]

    def to_json(self) -> str:
        fields: dict[str, Any] = dataclasses.asdict(cast(Any, self))
        for name, value in fields.items():
            if isinstance(value, datetime):
                fields[name] = value.astimezone(UTC).isoformat()
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Self:
        """Parse a value; InvalidArgumentError when it is not a record of this kind."""
        decoders = _decoders(cast(type, cls))
        try:
            data = json.loads(raw)
            values = {name: decode(data[name]) for name, decode in decoders.items()}
        except (ValueError, KeyError, TypeError) as error:
            raise errors.InvalidArgumentError(f"not a {cls.kind} record: {type(error).__name__}: {error}") from error
        record: Self = cast(Any, cls)(**values)
        return record


R = TypeVar("R", bound=JsonRecord)


def decoded(record_type: type[R], key: str, value: bytes) -> R | None:
    """`value` as a `record_type`, or None with a warning when it is not one."""
    try:
        return record_type.from_json(value)
    except errors.InvalidArgumentError as error:
        _log.warning(f"skipping malformed {record_type.kind} key", key=key, error=error.message)
        return None
