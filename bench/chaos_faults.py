"""The chaos run's seeded fault schedule and how each fault is done to the stack (bench/chaos.py).

`schedule(seed, count)` draws `count` faults, every kind in each round of `KINDS` (shuffled), each with the
pause before it; `short_round(seed)` is the test's one round, arranged so that it takes minutes (its
docstring). `inject` does one and returns what it hit: SIGKILL and restart of a process of a kind (the rollout
leader and the standby told apart by their health), SIGSTOP for longer than a lease, and three
trainer kills aimed at its worst moments, found from the logs as they are written:
- `trainer-push`: at the first replica's "policy version published" of a new version (the push still going to
  the other replica, or done and not yet reported);
- `trainer-push-report`: the rollout leader paused, then the trainer killed once every live replica serves the
  new version, so the version report to rollout cannot have been made;
- `trainer-checkpoint`: at the step log line of a step a checkpoint follows (the save starts right after).
Each records what it found at the kill (e.g. whether the checkpoint directory existed yet).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos_stack import CHECKPOINT_EVERY, LEASE_TTL_S, ChaosStack, Proc

KINDS = (
    "kill-gateway",
    "kill-rollout-leader",
    "kill-rollout-standby",
    "kill-inference",
    "kill-etcd",
    "kill-trainer",
    "pause-gateway",
    "pause-rollout-leader",
    "pause-inference",
    "trainer-push",
    "trainer-push-report",
    "trainer-checkpoint",
)
GROUPS_PER_STEP = 4
"""The quickstart's `[trainer.batch] groups_per_step`."""
STEP_WAIT_S = 15.0
"""How long the rollout leader stays paused waiting for the begun step's push."""
TRIGGER_TIMEOUT_S = 600.0
"""How long a trainer fault waits for its moment before it is recorded as missed: a restarted trainer imports torch
again and must do up to `checkpoints.every` steps first, minutes on a loaded 2-core machine."""


@dataclass
class Fault:
    """One scheduled fault and, once done, what it hit."""

    kind: str
    gap_s: float
    at: float = 0.0
    target: str = ""
    hit: str = ""
    seconds: float = 0.0


def schedule(
    seed: int, count: int, kinds: tuple[str, ...] = KINDS, gap: tuple[float, float] = (2.0, 8.0)
) -> list[Fault]:
    """`count` faults: rounds of every kind in `kinds`, each round shuffled by `seed`."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    while len(faults) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        faults += [Fault(kind, round(rng.uniform(*gap), 2)) for kind in round_]
    return faults[:count]


TRAINER_KINDS = ("trainer-checkpoint", "trainer-push", "trainer-push-report", "kill-trainer")
"""The faults that kill the trainer, in `short_round`'s order: the checkpoint moment first (the first trainer is
already on its way to a checkpointed step), then the push of the resumed trainer (it pushes as it starts, behind
the served versions), then a step's push before its report, then a random moment."""
SHORT_GAP_S = (0.5, 2.0)


def short_round(seed: int, gap: tuple[float, float] = SHORT_GAP_S) -> list[Fault]:
    """One fault of every kind in `KINDS`: each trainer fault (`TRAINER_KINDS`' order) followed by two of the
    others (shuffled by `seed`), so that the killed trainer restarts (imports torch again) while they are done
    instead of after them, and shorter pauses between faults. The same kinds and moments as a round of
    `schedule`; only the order and the pauses differ."""
    rng = random.Random(seed)
    others = [kind for kind in KINDS if kind not in TRAINER_KINDS]
    rng.shuffle(others)
    per_trainer = len(others) // len(TRAINER_KINDS)
    order: list[str] = []
    for i, kind in enumerate(TRAINER_KINDS):
        order += [kind, *others[i * per_trainer : (i + 1) * per_trainer]]
    order += others[len(TRAINER_KINDS) * per_trainer :]
    return [Fault(kind, round(rng.uniform(*gap), 2)) for kind in order]


class LogTail:
    """New JSON lines of a log file since the last read (non-JSON lines skipped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        found = []
        for raw in data[:cut].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                found.append(line)
        return found


def _until(found: Callable[[], str | None], timeout: float = TRIGGER_TIMEOUT_S, poll: float = 0.02) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hit = found()
        if hit is not None:
            return hit
        time.sleep(poll)
    return None


def _served(stack: ChaosStack) -> int:
    """The newest policy version a replica logged as published (0: none yet)."""
    return max((_served_by(p) for p in stack.of_kind("inference")), default=0)


def _all_lines(path: Path) -> list[dict[str, Any]]:
    tail = LogTail(path)
    tail.offset = 0
    return tail.lines()


class Injector:
    """Does faults to one stack (see the module docstring)."""

    def __init__(self, stack: ChaosStack, seed: int) -> None:
        self.stack = stack
        self.rng = random.Random(seed + 1)

    def _pick(self, kind: str) -> Proc | None:
        """A live process of `kind`; the rollout leader or standby once there is a leader (a takeover may be
        under way: waited for up to TRIGGER_TIMEOUT_S)."""
        if kind.startswith("rollout-"):
            deadline = time.monotonic() + TRIGGER_TIMEOUT_S
            while (leader := self.stack.leader()) is None and time.monotonic() < deadline:
                time.sleep(0.5)
            if kind == "rollout-leader":
                return leader
            others = [p for p in self.stack.of_kind("rollout") if p is not leader and p.alive]
            return others[0] if others and leader is not None else None
        alive = [p for p in self.stack.of_kind(kind) if p.alive and not p.paused]
        return self.rng.choice(alive) if alive else None

    def inject(self, fault: Fault) -> None:
        fault.at = time.time()
        action, _, kind = fault.kind.partition("-")
        if action == "trainer":
            fault.target = "trainer"
            fault.hit = self._trainer(kind)
        else:
            proc = self._pick(kind)
            if proc is None:
                fault.hit = "missed: no such process alive"
            else:
                fault.target = proc.name
                fault.hit = self._kill(proc) if action == "kill" else self._pause(proc)
        fault.seconds = round(time.time() - fault.at, 2)

    def _kill(self, proc: Proc) -> str:
        proc.kill()
        down = self.rng.uniform(0.5, 3.0)
        time.sleep(down)
        self.stack.restart(proc)
        resumed = ""
        if proc.kind == "trainer":
            resumed = f", resumed from {self.stack.latest_checkpoint() or 'the start'}"
        return f"SIGKILL, down {down:.1f} s{resumed}"

    def _pause(self, proc: Proc) -> str:
        held = LEASE_TTL_S + self.rng.uniform(1.0, 4.0)
        proc.signal_stop()
        time.sleep(held)
        proc.signal_cont()
        return f"SIGSTOP {held:.1f} s (lease {LEASE_TTL_S} s)"

    def _trainer(self, moment: str) -> str:
        trainer = self.stack.procs["trainer"]
        if moment == "trainer":
            return self._kill(trainer)
        if moment == "checkpoint":
            hit = self._at_checkpoint(trainer)
        elif moment == "push":
            hit = self._at_push(trainer)
        else:
            hit = self._between_push_and_report(trainer)
        if hit is None:
            return "missed: the moment did not come in time"
        return f"{hit}; {self._kill(trainer)}"

    def _at_checkpoint(self, trainer: Proc) -> str | None:
        tail = LogTail(trainer.log)

        def found() -> str | None:
            for line in tail.lines():
                step = int(line.get("step", 0)) if line.get("event") == "step" else 0
                if step and step % CHECKPOINT_EVERY == 0:
                    trainer.signal_stop()
                    written = (self.stack.checkpoints / f"step-{step:06d}").exists()
                    return f"step {step}: checkpoint {'already written' if written else 'being saved'}"
            return None

        return _until(found)

    def _at_push(self, trainer: Proc) -> str | None:
        tails = [LogTail(p.log) for p in self.stack.of_kind("inference")]

        def found() -> str | None:
            for tail in tails:
                for line in tail.lines():
                    if line.get("event") == "policy version published" and line.get("policy_version"):
                        trainer.signal_stop()
                        return f"v{line['policy_version']} published on {tail.path.stem}, push not finished"
            return None

        return _until(found)

    def _between_push_and_report(self, trainer: Proc) -> str | None:
        """After a step line, once rollout has delivered a step's groups (the next step has begun): pause the
        leader, wait for every live replica to serve a new version (the report now waits on the paused leader),
        then stop the trainer. A step that does not come (stale groups: it needs more) is tried again."""
        tails = [LogTail(p.log) for p in self.stack.of_kind("rollout")]
        trainer_tail = LogTail(trainer.log)
        delivered: list[int] = [-1]  # groups delivered since the last step line; -1: no step line yet

        def step_begun() -> str | None:
            if any(line.get("event") == "step" for line in trainer_tail.lines()):
                delivered[0] = 0
            got = sum(1 for tail in tails for line in tail.lines() if line.get("method", "").endswith("/StreamGroups"))
            delivered[0] += got if delivered[0] >= 0 else 0
            return "begun" if delivered[0] >= GROUPS_PER_STEP else None

        deadline = time.monotonic() + TRIGGER_TIMEOUT_S
        while time.monotonic() < deadline and _until(step_begun, deadline - time.monotonic()):
            delivered[0] = -1
            leader = self.stack.leader()
            if leader is None:
                continue
            hit = self._paused_push(trainer, leader)
            if hit is not None:
                return hit
        return None

    def _paused_push(self, trainer: Proc, leader: Proc) -> str | None:
        """Pause `leader` until every live replica serves a new version, then stop the trainer (None: no push)."""
        before = _served(self.stack)
        live = [p for p in self.stack.of_kind("inference") if p.alive and not p.paused]
        leader.signal_stop()

        def pushed() -> str | None:
            versions = [_served_by(p) for p in live]
            if versions and min(versions) > before:
                trainer.signal_stop()
                return f"v{min(versions)} served by every live replica, rollout leader {leader.name} paused"
            return None

        try:
            return _until(pushed, timeout=STEP_WAIT_S, poll=0.1)
        finally:
            leader.signal_cont()


def _served_by(proc: Proc) -> int:
    versions = [
        int(x.get("policy_version", 0)) for x in _all_lines(proc.log) if x.get("event") == "policy version published"
    ]
    return max(versions, default=0)
