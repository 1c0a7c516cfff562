"""bench/chaos_checks.py's "pushed version served before rollout heard it", on written logs: a replica registered
before a push began must serve its version at the report; one that registered while the push ran was not in it
(the trainer pushes to the replicas registered when a push begins) and is counted apart, not as late."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from bench.chaos_checks import _served_before_heard
from bench.chaos_stack import ChaosStack, Proc

T0 = 1_800_000_000.0


def _line(at: float, event: str, **fields: object) -> str:
    return json.dumps({"timestamp": datetime.fromtimestamp(at, UTC).isoformat(), "event": event, **fields})


def _stack(tmp_path: Path, registered_at: float) -> ChaosStack:
    """A trainer whose push of v1 ran from T0+10 to T0+12, reported at T0+13; a replica started at T0 that
    registered at `registered_at` and never published."""
    stack = ChaosStack.__new__(ChaosStack)
    stack.procs = {}
    trainer = Proc("trainer", "trainer", [], tmp_path / "trainer.log", {}, timeline=[(T0, "start")])
    trainer.log.write_text(_line(T0 + 12, "weights pushed", policy_version=1, seconds=2.0) + "\n")
    replica = Proc("inference-1", "inference", [], tmp_path / "inference-1.log", {}, timeline=[(T0, "start")])
    replica.log.write_text(_line(registered_at, "inference replica registered in etcd") + "\n")
    stack.procs = {"trainer": trainer, "inference-1": replica}
    return stack


def test_a_replica_registered_before_the_push_and_behind_at_the_report_is_late(tmp_path: Path) -> None:
    check = _served_before_heard(_stack(tmp_path, registered_at=T0 + 5), [(T0 + 13, 1)])
    assert not check.ok
    assert "served late: 1 (v1 heard, inference-1 served v0)" in check.found


def test_a_replica_registered_while_the_push_ran_is_counted_apart(tmp_path: Path) -> None:
    check = _served_before_heard(_stack(tmp_path, registered_at=T0 + 11), [(T0 + 13, 1)])
    assert check.ok, check.found
    assert "served late: 0; registered during the push reported (not in it, not yet routed to): 1" in check.found
