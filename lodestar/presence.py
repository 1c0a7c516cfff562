"""What live processes announce in etcd, and how it is read back: gateway nodes (`<prefix>nodes/<id>`,
lodestar_gateway/membership.py) and inference replicas (`<prefix>inference/<id>`, inference_registry.py).

Each announces a `JsonRecord` (a frozen dataclass of str, int and datetime fields, one JSON object) under
its own key in its kind's directory, written by a `lodestar.leased_key.LeasedKey`. Readers list the
directory and decode each value; a value that is not a record of the kind is logged and skipped (another
version's writer, a hand-written key), never fatal to the reader. A kind's `Directory` holds both: its keys
(`prefix`, `key`) and the listing (`read`), so each kind declares one and writes no helpers of its own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, cast, get_type_hints

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


class StoredKey(Protocol):
    """A key as `lodestar.etcd` reads it (`KeyValue`; a Protocol here: the etcd wrapper imports this module)."""

    @property
    def key(self) -> str: ...
    @property
    def value(self) -> bytes: ...
    @property
    def lease_id(self) -> int: ...
    @property
    def mod_revision(self) -> int: ...


class PrefixSnapshot(Protocol):
    @property
    def items(self) -> Sequence[StoredKey]: ...
    @property
    def revision(self) -> int: ...


class PrefixReader(Protocol):
    """What listing a directory needs of `lodestar.etcd.EtcdClient`."""

    async def get_prefix(self, prefix: str) -> PrefixSnapshot: ...


@dataclasses.dataclass(frozen=True)
class Directory(Generic[R]):
    """One kind's directory of presence records (`<prefix><name>/<id>`, one `record_type` each): its keys, and
    the records in it now. `what` names the kind in errors ("node", "replica")."""

    name: str
    what: str
    record_type: type[R]

    def prefix(self, prefix: str = DEFAULT_PREFIX) -> str:
        """Where the keys live: `<prefix><name>/`."""
        return directory(prefix, self.name)

    def key(self, member_id: str, prefix: str = DEFAULT_PREFIX) -> str:
        """One member's key; InvalidArgumentError for an empty id or one with a '/'."""
        return member_key(prefix, self.name, member_id, self.what)

    async def read(self, client: PrefixReader, prefix: str = DEFAULT_PREFIX) -> tuple[list[tuple[StoredKey, R]], int]:
        """The keys registered now (sorted by key) with their records, and the revision they were read at;
        values that are not records of the kind are skipped (logged)."""
        snapshot = await client.get_prefix(self.prefix(prefix))
        found = [
            (item, record)
            for item in snapshot.items
            if (record := decoded(self.record_type, item.key, item.value)) is not None
        ]
        return found, snapshot.revision
