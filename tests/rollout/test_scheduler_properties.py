"""Random interleavings of hand-outs, results (current, late, repeated), lost nodes and polls: no session
is ever counted twice, nothing is lost, and every run finishes once its nodes keep working."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from lodestar.errors import FailedPreconditionError
from lodestar.v1 import rollout_pb2
from lodestar_rollout.model import LIVE, GroupStatus, SessionStatus, StoredResult
from lodestar_rollout.scheduler import Progress, Scheduler
from lodestar_rollout.spec import with_defaults
from tests.rollout.helpers import CANCELLED, INFRA_FAILED, SCORED, TIMED_OUT, make_spec

OUTCOMES = [SCORED, SCORED, SCORED, TIMED_OUT, INFRA_FAILED, CANCELLED]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), fraction=st.sampled_from([0.5, 0.75, 1.0]), attempts=st.integers(1, 3))
def test_random_interleavings_count_each_session_at_most_once(seed: int, fraction: float, attempts: int) -> None:
    rng = random.Random(seed)
    scheduler = Scheduler()
    scheduler.add_run(
        "r", with_defaults(make_spec(tasks=4, group_size=4, early_stop_fraction=fraction, max_attempts=attempts)), 0.0
    )
    nodes = {f"n{i}": {} for i in range(3)}  # node -> {session: attempt} it believes it holds
    dead: list[tuple[str, str, int]] = []  # results of superseded attempts, replayed later
    counted: dict[str, int] = {}

    def record(results: list[StoredResult]) -> None:
        for stored in results:
            if stored.counted:
                counted[stored.result.session_id] = counted.get(stored.result.session_id, 0) + 1
                assert counted[stored.result.session_id] == 1, f"{stored.result.session_id} counted twice"

    now = 0.0
    for _ in range(400):
        now += 1.0
        node_id = rng.choice(list(nodes))
        held = nodes[node_id]
        action = rng.random()
        if action < 0.35:
            got = scheduler.acquire(node_id, 1, rng.randint(0, 3), [Progress(s, a) for s, a in held.items()], now)
            for session_id, attempt in got.cancelled:
                if held.get(session_id) == attempt:
                    del held[session_id]
            held.update({s.session_id: s.attempt for s in got.assigned})
        elif action < 0.75 and held:
            session_id, attempt = rng.choice(sorted(held.items()))
            outcome = rng.choice(OUTCOMES)
            result = rollout_pb2.SessionResult(session_id=session_id, attempt=attempt, node_id=node_id, outcome=outcome)
            _, changes = scheduler.complete(result, now)
            record(changes.results)
            if rng.random() < 0.2:
                dead.append((node_id, session_id, attempt))  # a retry of the same report, later
            del held[session_id]
        elif action < 0.85 and held:  # the node dies: its keys vanish
            for session_id, attempt in held.items():
                scheduler.lose(session_id, attempt, "lease ended", now)
                dead.append((node_id, session_id, attempt))
            held.clear()
        elif dead:
            node, session_id, attempt = dead.pop(rng.randrange(len(dead)))
            result = rollout_pb2.SessionResult(session_id=session_id, attempt=attempt, node_id=node, outcome=SCORED)
            try:
                _, changes = scheduler.complete(result, now)
            except FailedPreconditionError:
                continue
            record(changes.results)
    for session_id, session in scheduler.sessions.items():  # what the store would hold as counted results
        assert (counted.get(session_id, 0) == 1) == (session.status is SessionStatus.SCORED), session_id
    # Keep one healthy node working: the run must finish.
    for _ in range(200):
        now += 1.0
        got = scheduler.acquire("healthy", 1, 4, [], now)
        for session in got.assigned:
            result = rollout_pb2.SessionResult(
                session_id=session.session_id, attempt=session.attempt, node_id="healthy", outcome=SCORED
            )
            record(scheduler.complete(result, now)[1].results)
        for session in scheduler.running():  # attempts still held by the random nodes end with their leases
            scheduler.lose(session.session_id, session.attempt, "lease ended", now)
        if scheduler.runs["r"].state == rollout_pb2.RUN_STATE_COMPLETED:
            break
    assert scheduler.runs["r"].state == rollout_pb2.RUN_STATE_COMPLETED
    for group in scheduler.groups.values():
        assert group.status in (GroupStatus.COMPLETE, GroupStatus.FAILED)
        scored = [sid for sid in group.session_ids if scheduler.sessions[sid].status is SessionStatus.SCORED]
        assert len(scored) <= group.required
        assert not any(scheduler.sessions[sid].status in LIVE for sid in group.session_ids)
