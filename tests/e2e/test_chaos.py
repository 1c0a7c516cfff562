"""The short chaos run (bench/chaos.py --short, docs/chaos.md): the quickstart's training on three etcd members,
two inference replicas, two rollout instances, two gateway nodes and the trainer, with a seeded round of one fault
of every kind (SIGKILL and restart of each kind of process, SIGSTOP past a lease, the trainer killed at a push,
between a push and its report, at a checkpoint save and at a random moment, then resumed), and every check made
afterwards from the store, the metrics and the logs must pass. The round is `short_round`: each trainer kill is
followed by two other faults while the trainer restarts, 0.5-2 s apart; the run is as long as the trainer's
moments take to come: 135 s on the quiet 2-core machine, 4-6 min loaded. Part of `make test` (and alone:
`make test-chaos`); docs/chaos.md ("The short version") has its runs and the defects it found."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import run, table
from bench.chaos_faults import KINDS

pytestmark = [pytest.mark.slow, pytest.mark.chaos]
SEED = 44
TIMEOUT_S = 900
"""The stack's start, the round (four trainer restarts, each importing torch again) and the checks: a few minutes
on a quiet 2-core machine; the bound leaves room for a loaded one."""


@pytest.mark.timeout(TIMEOUT_S)
def test_chaos_keeps_every_promise(tmp_path: Path) -> None:
    report = run(tmp_path / "chaos", duration_s=None, seed=SEED, short=True)
    print(table(report))
    assert sorted(f.kind for f in report.faults) == sorted(KINDS)
    missed = [f"{f.kind}: {f.hit}" for f in report.faults if f.hit.startswith("missed")]
    assert not missed, missed
    failed = [f"{c.name}: {c.found}" for c in report.checks if not c.ok]
    assert not failed, table(report)
