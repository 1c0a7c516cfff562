"""Records that processes announce in etcd (lodestar/presence.py): keys under a kind's directory, the JSON
encoding of str, int and datetime fields, and a bad value refused in one clear error, skipped by readers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.presence import JsonRecord, decoded, directory, member_key


@dataclass(frozen=True)
class Probe(JsonRecord):
    kind = "probe"

    name: str
    count: int
    at: datetime


def test_keys_live_under_the_kinds_directory_and_ids_are_checked() -> None:
    assert directory("/lodestar", "nodes") == directory("/lodestar/", "nodes") == "/lodestar/nodes/"
    assert member_key("/x/", "inference", "r1", "replica") == "/x/inference/r1"
    for bad in ("", "a/b"):
        with pytest.raises(InvalidArgumentError, match="replica id must be non-empty"):
            member_key("/x/", "inference", bad, "replica")


def test_a_record_round_trips_with_its_time_in_utc() -> None:
    local = datetime(2026, 12, 5, 10, 0, tzinfo=timezone(timedelta(hours=2)))
    record = Probe("a", 3, local)
    raw = record.to_json()
    assert '"at": "2026-12-05T08:00:00+00:00"' in raw
    back = Probe.from_json(raw.encode())
    assert back == record
    assert back.at.tzinfo == UTC


@pytest.mark.parametrize(
    "raw", [b"not json", b"[]", b'{"name": "a", "count": 1}', b'{"name": "a", "count": "x", "at": ""}']
)
def test_a_value_that_is_not_a_record_is_one_clear_error_and_skipped_by_readers(raw: bytes) -> None:
    with pytest.raises(InvalidArgumentError, match="not a probe record"):
        Probe.from_json(raw)
    assert decoded(Probe, "/x/probe/a", raw) is None
