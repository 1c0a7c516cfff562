"""Discrete-event simulation of rollout policies under heavy-tailed session durations.

The real `Scheduler` (services/rollout/lodestar_rollout/scheduler.py, with its group completion and staleness rules in
groups.py) hands out sessions; simulated nodes, sessions and a trainer advance in virtual time, so hours
of rollout take seconds. Session run times are lognormal (median 60 s, p99 15 min by default); every
session also needs `init_s` of preparation (workspace, HOME, task files).

Policies:
- `sync`: synchronous batches: a run of `batch_groups` tasks, every session waited for (early stop 1.0),
  preparation inside the run slot; the trainer trains when the batch is complete, then the next batch
  starts (nodes idle while it trains).
- `sync+ready+early-stop`: the same batches, but nodes prepare sessions in a READY buffer (preparation
  off the run slot) and a group completes at `early_stop` of its sessions (the rest are cancelled).
- `async...`: one big run; the trainer takes the next `batch_groups` groups from the stream whenever it
  is free (groups too stale at that moment are dropped by the stream) while rollout continues, and
  reports each new policy version. With admission control (the scheduler's default, groups.py) a run
  starts no new group while its lead of trainer batches is in play; `no-admission` disables that to show
  what it prevents. READY buffer (and early stop) as above; the scheduler serves the oldest group first.

Groups without signal (`signal_p` < 1: every reward equal) are read and skipped by the trainer, which
reads on until it has `batch_groups` groups with signal (dynamic sampling, services/trainer/lodestar_trainer/loop.py).

`python bench/rollout_sim.py` prints the staleness table of docs/benchmarks.md (Rollout): trainer idle
and stale-dropped share for max_staleness 1, 2 and 4, with and without many no-signal groups, for a
rollout-bound cluster (the default config) and a trainer-bound small node (`CAPITALS`).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lodestar.logging import configure_logging
from lodestar.v1 import rollout_pb2
from lodestar_rollout import groups
from lodestar_rollout.model import Group
from lodestar_rollout.scheduler import Progress, Scheduler
from lodestar_rollout.spec import with_defaults


@dataclass(frozen=True)
class Policy:
    name: str
    asynchronous: bool
    ready_buffer: int
    """Prepared sessions a node may hold beyond its run slots (0: preparation occupies the run slot)."""
    early_stop: float
    max_staleness: int = 4
    admission: bool = True
    """Async only: the scheduler's admission control (off: every group may start at once)."""


POLICIES = (
    Policy("sync", asynchronous=False, ready_buffer=0, early_stop=1.0),
    Policy("sync+ready+early-stop", asynchronous=False, ready_buffer=4, early_stop=0.75),
    Policy("async+ready", asynchronous=True, ready_buffer=4, early_stop=1.0),
    Policy("async+ready+early-stop, no admission", asynchronous=True, ready_buffer=4, early_stop=0.75, admission=False),
    Policy("async+ready+early-stop", asynchronous=True, ready_buffer=4, early_stop=0.75),
)


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 16
    slots_per_node: int = 8
    group_size: int = 8
    batch_groups: int = 16
    train_s: float = 120.0
    init_s: float = 10.0
    median_s: float = 60.0
    p99_s: float = 900.0
    hours: float = 6.0
    seed: int = 0
    signal_p: float = 1.0
    """Probability that a group has signal (rewards not all equal); the trainer skips the others."""


CAPITALS = SimConfig(
    nodes=1, slots_per_node=8, group_size=8, batch_groups=4, train_s=40.0, init_s=1.0, median_s=2.5, p99_s=10.0,
    hours=2.0,
)  # fmt: skip
"""A trainer-bound small node like examples/smollm2-capitals: 8 slots, ~2.5 s sessions, 4 groups per 40 s step."""


@dataclass
class SimResult:
    policy: str
    trainer_idle: float
    groups_per_min: float
    steps: int
    slot_utilization: float
    cancelled_share: float
    """Share of run-slot time spent on sessions that were later cancelled (early stop)."""
    dropped_groups: int
    max_staleness_seen: int
    delivered_groups: int = 0
    """Groups the trainer read (with or without signal)."""

    @property
    def stale_share(self) -> float:
        """Of the complete groups whose fate was decided, the share dropped as stale (sampling wasted)."""
        return self.dropped_groups / max(self.dropped_groups + self.delivered_groups, 1)


@dataclass
class _Node:
    node_id: str
    preparing: set[str] = field(default_factory=set)
    ready: list[str] = field(default_factory=list)
    running: dict[str, float] = field(default_factory=dict)
    """session -> run start time."""
    attempts: dict[str, int] = field(default_factory=dict)


class Simulation:
    def __init__(self, config: SimConfig, policy: Policy) -> None:
        self.config, self.policy = config, policy
        self.rng = random.Random(config.seed)
        self.signal_rng = random.Random(config.seed + 1)
        self.mu = math.log(config.median_s)
        self.sigma = math.log(config.p99_s / config.median_s) / 2.3263
        self.scheduler = Scheduler()
        self.nodes = [_Node(f"n{i}") for i in range(config.nodes)]
        self.events: list[tuple[float, int, str, tuple[str, ...]]] = []
        self.seq = 0
        self.now = 0.0
        self.runs: list[str] = []
        self.delivered: dict[str, int] = {}
        self.batch: list[Group] = []
        self.with_signal = 0
        self.training = False
        self.busy_s = self.slot_s = self.cancelled_s = 0.0
        self.steps = self.trained_groups = self.max_stale = 0
        self.version_at_start: dict[tuple[str, int], int] = {}
        """The policy version when a session attempt started running (that of its first call)."""

    def _at(self, time: float, kind: str, *payload: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time, self.seq, kind, payload))

    def _new_run(self, tasks: int) -> None:
        spec = rollout_pb2.RunSpec(
            group_size=self.config.group_size,
            early_stop_fraction=self.policy.early_stop,
            max_staleness=self.policy.max_staleness,
            max_attempts=3,
        )
        spec.harness.kind, spec.verifier.kind = "command", "exact_match"
        for index in range(tasks):
            spec.tasks.add(task_id=f"b{len(self.runs)}-t{index}")
        run_id = f"r{len(self.runs)}"
        self.scheduler.add_run(run_id, with_defaults(spec), self.now)
        self.runs.append(run_id)
        self.delivered[run_id] = 0

    def run(self) -> SimResult:
        horizon = self.config.hours * 3600
        # Async: one run with more tasks than the horizon can use; sync: one run per batch.
        self._new_run(int(self.config.hours * 60 * 20) if self.policy.asynchronous else self.config.batch_groups)
        self._pull_all()
        while self.events and self.events[0][0] <= horizon:
            self.now, _, kind, payload = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(*payload)
        self.now = horizon
        for node in self.nodes:  # sessions still running at the end use their slots until then
            self.slot_s += sum(horizon - started for started in node.running.values())
        slots = self.config.nodes * self.config.slots_per_node
        return SimResult(
            policy=self.policy.name,
            trainer_idle=1 - self.busy_s / horizon,
            groups_per_min=self.trained_groups / (horizon / 60),
            steps=self.steps,
            slot_utilization=self.slot_s / (slots * horizon),
            cancelled_share=self.cancelled_s / max(self.slot_s, 1e-9),
            dropped_groups=sum(self.scheduler.runs[r].groups_dropped for r in self.runs),
            max_staleness_seen=self.max_stale,
            delivered_groups=sum(self.scheduler.runs[r].groups_delivered for r in self.runs),
        )

    # -- nodes -------------------------------------------------------------------------------------

    def _holding(self, node: _Node) -> int:
        return len(node.preparing) + len(node.ready) + len(node.running)

    def _pull_all(self) -> None:
        for node in self.nodes:
            self._pull(node)

    def _pull(self, node: _Node) -> None:
        capacity = self.config.slots_per_node + self.policy.ready_buffer
        free = capacity - self._holding(node)
        if free <= 0:
            return
        held = [Progress(sid, attempt) for sid, attempt in node.attempts.items()]
        acquired = self.scheduler.acquire(node.node_id, 1, free, held, self.now)
        for session in acquired.assigned:
            node.attempts[session.session_id] = session.attempt
            node.preparing.add(session.session_id)
            self._at(self.now + self.config.init_s, "prepared", node.node_id, session.session_id)

    def _node(self, node_id: str) -> _Node:
        return self.nodes[int(node_id[1:])]

    def _on_prepared(self, node_id: str, session_id: str) -> None:
        node = self._node(node_id)
        if session_id not in node.preparing:
            return  # cancelled meanwhile
        node.preparing.discard(session_id)
        node.ready.append(session_id)
        self._start_runs(node)

    def _start_runs(self, node: _Node) -> None:
        # Without a READY buffer preparation happened inside the slot: its time counts as slot time.
        in_slot_prep = self.config.init_s if self.policy.ready_buffer == 0 else 0.0
        while node.ready and len(node.running) < self.config.slots_per_node:
            session_id = node.ready.pop(0)
            node.running[session_id] = self.now - in_slot_prep
            self.version_at_start[(session_id, node.attempts[session_id])] = self.scheduler.policy_version
            duration = self.rng.lognormvariate(self.mu, self.sigma)
            self._at(self.now + duration, "finished", node.node_id, session_id, str(node.attempts[session_id]))
        self._pull(node)

    def _on_finished(self, node_id: str, session_id: str, attempt: str) -> None:
        node = self._node(node_id)
        if node.attempts.get(session_id) != int(attempt) or session_id not in node.running:
            return  # cancelled earlier
        self._free(node, session_id, cancelled=False)
        result = rollout_pb2.SessionResult(
            session_id=session_id,
            attempt=int(attempt),
            node_id=node_id,
            outcome=rollout_pb2.SESSION_OUTCOME_SCORED,
            reward=self.rng.random(),
        )
        result.calls.add(policy_version=self.version_at_start.pop((session_id, int(attempt))))
        _, changes = self.scheduler.complete(result, self.now)
        for other_id, other_attempt in changes.released:
            if other_id == session_id:
                continue
            other = self.scheduler.sessions[other_id]
            holder = self._node(other.node_id)
            if holder.attempts.get(other_id) == other_attempt:
                self._free(holder, other_id, cancelled=True)
                self._start_runs(holder)
        self._start_runs(node)
        if changes.group_events:
            self._maybe_train()

    def _free(self, node: _Node, session_id: str, *, cancelled: bool) -> None:
        node.attempts.pop(session_id, None)
        node.preparing.discard(session_id)
        if session_id in node.ready:
            node.ready.remove(session_id)
        started = node.running.pop(session_id, None)
        if started is not None:
            self.slot_s += self.now - started
            if cancelled:
                self.cancelled_s += self.now - started

    def _maybe_train(self) -> None:
        """A free trainer reads the next groups from the stream (lazily, as a flow-controlled reader)."""
        if self.training:
            return
        scheduler = self.scheduler
        read = False
        for run_id in self.runs:
            run = scheduler.runs[run_id]
            if not self.policy.asynchronous and not run.finished:
                continue
            while self.with_signal < self.config.batch_groups:
                group, changes = groups.next_group(scheduler, run, self.delivered[run_id])
                read = read or bool(changes.groups)
                if group is None:
                    break
                self.delivered[run_id] = group.delivery_seq
                self.batch.append(group)
                self.with_signal += self.signal_rng.random() < self.config.signal_p
        if read:
            self._pull_all()  # groups left play: new ones may be admitted (real nodes poll every second or so)
        if self.with_signal < self.config.batch_groups:
            return
        batch, self.batch, self.with_signal = self.batch, [], 0
        self.max_stale = max(self.max_stale, *(scheduler.policy_version - g.min_policy_version for g in batch))
        self.training = True
        self.busy_s += self.config.train_s
        self.trained_groups += self.config.batch_groups
        self._at(self.now + self.config.train_s, "trained")

    def _on_trained(self) -> None:
        self.training = False
        self.steps += 1
        self.scheduler.report_policy_version(self.scheduler.policy_version + 1)
        if not self.policy.asynchronous:
            self._new_run(self.config.batch_groups)
        self._pull_all()  # new groups may be admitted now
        self._maybe_train()


def simulate(config: SimConfig, policies: tuple[Policy, ...] = POLICIES) -> list[SimResult]:
    results = []
    admits = groups.admits_new_group
    for policy in policies:
        groups.admits_new_group = admits if policy.admission else _admit_all
        try:
            results.append(Simulation(config, policy).run())
        finally:
            groups.admits_new_group = admits
    return results


def _admit_all(*_: object, **__: object) -> bool:
    return True


STALENESS_BOUNDS = (1, 2, 4)
SIGNAL_PS = (1.0, 0.55)


def staleness_rows(config: SimConfig, early_stop: float) -> list[tuple[int, float, SimResult]]:
    """(max_staleness, signal_p, result) of the admission-controlled async policy for each bound and signal."""
    rows = []
    for signal_p in SIGNAL_PS:
        for bound in STALENESS_BOUNDS:
            policy = Policy(f"async, max_staleness {bound}", True, 4, early_stop, max_staleness=bound)
            (result,) = simulate(replace(config, signal_p=signal_p), (policy,))
            rows.append((bound, signal_p, result))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="Trainer idle and stale-dropped share by max_staleness.")
    parser.add_argument("--seed", type=int, default=0, help="random seed of session durations and group signal")
    args = parser.parse_args()
    configure_logging("error")  # not a line per dropped group
    for name, config, early_stop in (("cluster", SimConfig(), 0.75), ("capitals", CAPITALS, 1.0)):
        print(f"{name}: {config}, early stop {early_stop}")
        print("max_staleness | signal p | trainer idle | stale dropped | dropped/delivered | groups trained/min")
        for bound, signal_p, r in staleness_rows(replace(config, seed=args.seed), early_stop):
            print(
                f"{bound} | {signal_p:.2f} | {r.trainer_idle:.1%} | {r.stale_share:.1%} | "
                f"{r.dropped_groups}/{r.delivered_groups} | {r.groups_per_min:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
