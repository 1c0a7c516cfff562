"""The short chaos run (bench/chaos.py, docs/chaos.md): the quickstart's training on three etcd members, two
inference replicas, two rollout instances, two gateway nodes and the trainer, with a seeded schedule of one
fault of every kind (SIGKILL and restart of each kind of process, SIGSTOP past a lease, the trainer killed at a
push, between a push and its report and at a checkpoint save, then resumed), and every check made afterwards
from the store, the metrics and the logs must pass. The schedule is the seed's first round of `KINDS`: each
kind once, whatever the machine's speed (the run is as long as the faults take, a few minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import run, table
from bench.chaos_faults import KINDS

pytestmark = [pytest.mark.slow, pytest.mark.chaos]
SEED = 44
TIMEOUT_S = 1500
"""The stack's start, one round of faults (four trainer restarts, each importing torch again) and the checks."""


@pytest.mark.timeout(TIMEOUT_S)
def test_chaos_keeps_every_promise(tmp_path: Path) -> None:
    report = run(tmp_path / "chaos", duration_s=None, seed=SEED, rounds=1)
    print(table(report))
    assert sorted(f.kind for f in report.faults) == sorted(KINDS)
    missed = [f"{f.kind}: {f.hit}" for f in report.faults if f.hit.startswith("missed")]
    assert not missed, missed
    failed = [f"{c.name}: {c.found}" for c in report.checks if not c.ok]
    assert not failed, table(report)
