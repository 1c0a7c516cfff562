"""The store on a real SQLite file and on a real PostgreSQL (the same tests, `store_location`): everything
the scheduler changed loads back the same, results keep
every CallRecord, attempts keep their timings, and a group commit writes many snapshots at once."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest
from google.protobuf import duration_pb2

from lodestar_rollout import store as store_module
from lodestar_rollout.model import Changes
from lodestar_rollout.scheduler import Progress, Scheduler
from lodestar_rollout.spec import with_defaults
from lodestar_rollout.store import rows_for
from lodestar_rollout.stores import open_store
from tests.rollout.helpers import INFRA_FAILED, SCORED, call_record, make_spec, session_result

_DERIVED = {"completion_order", "delivery_order", "decided", "groups_in_play", "batch_estimate", "version_mark"}


def _fields(obj: object, skip: set[str] = frozenset()) -> dict[str, object]:  # type: ignore[assignment]
    return {k: v for k, v in dataclasses.asdict(obj).items() if k not in skip}  # type: ignore[call-overload]


def test_state_round_trips_through_the_store(store_location: str) -> None:
    scheduler = Scheduler()
    changes = scheduler.add_run("r", with_defaults(make_spec(tasks=3, group_size=2, early_stop_fraction=0.5)), 1.5)
    changes.merge(scheduler.acquire("a", 7, 5, [], 2.0).changes)
    scheduler.acquire("a", 7, 0, [Progress("r-g2-s0", 1, 2)], 2.5)
    result = session_result("r-g0-s0", 1, "a", SCORED, reward=0.75, versions=(3, 4))
    result.calls.append(call_record("r-g0-s0", sequence=2, body='{"x": 1}'))
    result.agent_duration.CopyFrom(duration_pb2.Duration(seconds=2, nanos=500_000_000))
    changes.merge(scheduler.complete(result, 3.0)[1])
    changes.merge(scheduler.complete(session_result("r-g1-s0", 1, "a", INFRA_FAILED), 3.0)[1])
    changes.merge(scheduler.lose("r-g1-s1", 1, "lease ended", 4.0))
    changes.merge(Changes(policy_version=9))
    changes.sessions |= set(scheduler.sessions)
    store = open_store(store_location)
    store.write([rows_for(changes, scheduler.runs, scheduler.groups, scheduler.sessions)])
    store.close()

    loaded = open_store(store_location)
    state = loaded.load()
    assert state.policy_version == 9
    (run,) = state.runs
    assert _fields(run, {"spec", *_DERIVED}) == _fields(scheduler.runs["r"], {"spec", *_DERIVED})
    assert run.spec == scheduler.runs["r"].spec
    assert run.stage_sums == {"run": 2.5}
    for group in state.groups:
        assert _fields(group, {"started"}) == _fields(scheduler.groups[group.group_id], {"started"})
    for session in state.sessions:
        original = scheduler.sessions[session.session_id]
        assert _fields(session, {"missed_polls"}) == _fields(original, {"missed_polls"}), session.session_id
    (stored,) = loaded.counted_results(["r-g0-s0", "r-g1-s0"])  # the infra failure is stored, not counted
    assert stored == result
    attempts = loaded.attempts("r-g1-s1")
    assert [(a.attempt, a.node_id, a.lease_id, a.outcome, a.error) for a in attempts] == [
        (1, "a", 7, "lost", "lease ended")
    ]
    assert loaded.attempts("r-g0-s0")[0].stage_seconds == {"run": 2.5}

    restored = Scheduler()
    restored.restore(state.runs, state.groups, state.sessions)
    assert restored.runs["r"].groups_in_play == 3  # g0 complete (undecided), g1 and g2 open; all started
    assigned = restored.acquire("b", 8, 10, [], 5.0).assigned
    assert [(s.session_id, s.attempt) for s in assigned] == [("r-g1-s0", 2), ("r-g1-s1", 2), ("r-g2-s1", 1)]


def test_a_group_commit_writes_every_snapshot_in_order(store_location: str) -> None:
    scheduler = Scheduler()
    first = scheduler.add_run("r", with_defaults(make_spec(tasks=1, group_size=1)), 0.0)
    first_rows = rows_for(first, scheduler.runs, scheduler.groups, scheduler.sessions)
    second = scheduler.acquire("a", 1, 1, [], 1.0).changes
    second_rows = rows_for(second, scheduler.runs, scheduler.groups, scheduler.sessions)
    store = open_store(store_location)
    store.write([first_rows, second_rows])
    (session,) = store.load().sessions
    assert (session.status.value, session.attempt, session.node_id) == ("running", 1, "a")


def test_a_wal_grown_behind_a_reader_is_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An outside reader holding a snapshot lets the WAL grow; once it lets go, the next checkpoint rewinds
    the WAL and `journal_size_limit` truncates the file (without it SQLite keeps the high-water mark)."""
    monkeypatch.setattr(store_module, "JOURNAL_SIZE_LIMIT", 1 << 20)
    path = tmp_path / "rollout.sqlite"
    store = store_module.SqliteStore(path)
    scheduler = Scheduler()
    changes = scheduler.add_run("r", with_defaults(make_spec(tasks=60, group_size=1)), 1.0)
    changes.merge(scheduler.acquire("a", 7, 60, [], 2.0).changes)
    store.write([rows_for(changes, scheduler.runs, scheduler.groups, scheduler.sessions)])
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM runs").fetchall()  # holds its snapshot: no checkpoint passes it

    def complete(task: int, body: str) -> None:
        result = session_result(f"r-g{task}-s0", 1, "a", SCORED, reward=1.0)
        result.calls.append(call_record(f"r-g{task}-s0", sequence=0, body=body))
        done = scheduler.complete(result, 3.0)[1]
        store.write([rows_for(done, scheduler.runs, scheduler.groups, scheduler.sessions)])

    for task in range(30):
        complete(task, "x" * 200_000)
    wal = path.with_name(path.name + "-wal")
    grown = wal.stat().st_size
    assert grown > 4 << 20
    reader.execute("COMMIT")
    reader.close()
    for task in range(30, 60):
        complete(task, "y")
    after = wal.stat().st_size
    store.close()
    assert after < grown // 3, (grown, after)  # the later small writes fill it again from the start
