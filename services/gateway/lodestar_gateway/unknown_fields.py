"""Unknown top-level request fields: accepted (default) or refused (`--strict-fields`), logged, counted.

Harnesses ship weekly and a new release may send a vendor field the gateway does not know yet. Refusing
it (as the vendors do) would stop every session of a run at once, so by default the field is accepted:
the body is kept verbatim in the CallRecord's `original_request_json`, the field plays no part in the
generation, the first sighting per (dialect, field) in this process is logged as a warning, and every
sighting is counted (GetNodeStatus.unknown_fields). `strict=True` keeps the vendor-exact refusal (400
naming the field).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lodestar.logging import get_logger
from lodestar.v1 import common_pb2
from lodestar_gateway.dialects.fields import fail

_log = get_logger("gateway.fields")


class UnknownFields:
    """Per-process policy and counts of unknown top-level fields."""

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self._counts: Counter[tuple[common_pb2.Dialect.ValueType, str]] = Counter()

    def check(self, dialect: common_pb2.Dialect.ValueType, names: Sequence[str]) -> None:
        """Refuse (strict) or note the unknown fields of one request."""
        if not names:
            return
        if self.strict:
            raise fail(names[0], "unknown field (not part of this API)")
        for name in names:
            key = (dialect, name)
            if key not in self._counts:
                _log.warning(
                    "unknown request field accepted (ignored)", dialect=common_pb2.Dialect.Name(dialect), field=name
                )
            self._counts[key] += 1

    def counts(self) -> list[tuple[common_pb2.Dialect.ValueType, str, int]]:
        """(dialect, field, requests) for every unknown field seen, most frequent first."""
        return [(dialect, name, count) for (dialect, name), count in self._counts.most_common()]
