"""bench/chaos_faults.py's schedules, without a stack: the test's short round has every kind of fault once, each
trainer kill followed by two other faults (the restart overlaps them), and is the same for the same seed."""

from __future__ import annotations

import itertools

from bench.chaos_faults import KINDS, SHORT_GAP_S, TRAINER_KINDS, schedule, short_round


def test_short_round_has_every_kind_once() -> None:
    for seed in range(20):
        faults = short_round(seed)
        assert sorted(f.kind for f in faults) == sorted(KINDS)
        assert all(SHORT_GAP_S[0] <= f.gap_s <= SHORT_GAP_S[1] for f in faults)


def test_short_round_spaces_the_trainer_kills() -> None:
    kinds = [f.kind for f in short_round(44)]
    trainer_at = [i for i, kind in enumerate(kinds) if kind in TRAINER_KINDS]
    assert [kinds[i] for i in trainer_at] == list(TRAINER_KINDS)
    assert all(later - earlier == 3 for earlier, later in itertools.pairwise(trainer_at))
    assert not any(kind in TRAINER_KINDS for kind in kinds[trainer_at[-1] + 1 :])
    assert len(kinds) - trainer_at[-1] == 3


def test_short_round_is_seeded() -> None:
    assert short_round(44) == short_round(44)
    orders = {tuple(f.kind for f in short_round(seed)) for seed in range(10)}
    assert len(orders) > 1


def test_schedule_rounds_have_every_kind() -> None:
    faults = schedule(1, 2 * len(KINDS))
    assert sorted(f.kind for f in faults[: len(KINDS)]) == sorted(KINDS)
    assert sorted(f.kind for f in faults[len(KINDS) :]) == sorted(KINDS)
