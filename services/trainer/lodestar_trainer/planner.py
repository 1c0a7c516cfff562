"""What the next step trains on: rank 0 reads groups from the inbox until `groups_per_step` of them have
signal (the `batch` settings), and turns a plan's groups into the step's packed micro-batches.

The planner decides per group: a group too many policy versions behind is dropped (`max_staleness`), a group
whose rewards are all equal is dropped but its rewards still count (dynamic sampling), a bad group skips the
step, and a run of `stop_after_no_signal_groups` groups without signal stops training. A SaveCheckpoint
request (or a quiet wait) interrupts the reading; what was read so far waits for the next call. The control
plane turns that interruption into a plan of its own (control.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lodestar.logging import get_logger
from lodestar_trainer.builders import BuilderKind
from lodestar_trainer.data.batch import BuildStats, MicroBatch
from lodestar_trainer.data.groups import BadGroupError, GroupSamples, group_samples
from lodestar_trainer.data.pack import pack_step
from lodestar_trainer.data.sequences import build_step
from lodestar_trainer.data.split import SplitStats
from lodestar_trainer.inbox import IDLE, Idle, Inbox, SaveRequest
from lodestar_trainer.parallel.distributed import COLLECTIVE_TIMEOUT
from lodestar_trainer.settings import BatchSettings
from lodestar_trainer.status import StopReason
from lodestar_trainer.step.advantages import AdvantageKind

_log = get_logger("trainer")

KEEPALIVE_S = min(15.0, COLLECTIVE_TIMEOUT.total_seconds() / 6)
"""Longest wait of rank 0 for a group before the loop looks up: it tells the other ranks (waiting in a
collective) to wait on, and brings replicas that serve an older version than the trainer's up to it
(loop.py `_sync_inference`; one GetModelInfo per replica when none is behind)."""


@dataclass
class Plan:
    """What every rank does next (rank 0 decides; broadcast under torchrun)."""

    groups: list[GroupSamples] = field(default_factory=list)
    read: int = 0
    """Groups consumed from the stream for this plan (trained, dropped or in a skipped step)."""
    no_signal: int = 0
    no_signal_rewards: list[float] = field(default_factory=list)
    """The rewards of those groups' scored sessions: they count in the step's reward metrics (what the policy
    scores), though they are not trained on."""
    error: str = ""
    stop: StopReason | None = None
    """Stop instead of stepping, and why."""
    save: bool = False
    """With stop: write a checkpoint before stopping."""
    checkpoint: Path | None = None
    """Instead of a step: write a checkpoint here (SaveCheckpoint; every rank writes its shard)."""
    keepalive: bool = False
    """Instead of a step: nothing (rank 0 still waits for groups; the other ranks' collective ends in time)."""

    def rewards(self) -> list[float]:
        """Every scored session's reward the plan read: its groups' and those without signal."""
        return [reward for kept in self.groups for reward in kept.rewards] + self.no_signal_rewards


@dataclass(frozen=True)
class StepBatches:
    """A plan's groups built into sequences and packed: this rank's work and its statistics."""

    micro_batches: list[MicroBatch]
    stats: BuildStats
    split: SplitStats


class Planner:
    """Rank 0's group intake (`next_plan`) and every rank's building and packing (`batches`) for `run_id`;
    token ids at or above `vocab_size` are bad input (0: unchecked)."""

    def __init__(self, config: BatchSettings, *, run_id: str, vocab_size: int = 0) -> None:
        self.config, self.run_id, self.vocab_size = config, run_id, vocab_size
        self.counters: dict[str, float] = {"groups_no_signal": 0.0, "groups_stale": 0.0, "sessions_dropped": 0.0}
        """Totals since the start of this process, reported with every step (metrics.py)."""
        self._pending: tuple[Plan, int] | None = None
        """A plan whose groups were being read when a request came, and its run of groups without signal."""

    def next_plan(
        self, inbox: Inbox, *, policy_version: int, stopping: Callable[[], bool]
    ) -> Plan | SaveRequest | Idle:
        """Read groups until `groups_per_step` have signal; a plan with `stop` set when the run ends, Stop was
        asked (`stopping()`) or `stop_after_no_signal_groups` groups in a row had no signal; a plan with `error`
        on a bad group.

        The run of groups without signal is counted within the plan: the previous plan ended with a group that
        had signal. Stale groups neither extend nor break it (their rewards are not looked at).

        A SaveCheckpoint request (or a quiet KEEPALIVE_S) interrupts the reading and is returned instead: the
        plan read so far is kept for the next call."""
        plan, without_signal = self._pending or (Plan(), 0)
        self._pending = None
        limit = self.config.stop_after_no_signal_groups
        while len(plan.groups) < self.config.groups_per_step:
            group = inbox.next(KEEPALIVE_S) if not stopping() else None
            if isinstance(group, SaveRequest) or group is IDLE:
                self._pending = (plan, without_signal)
                return group
            if group is None:
                plan.stop = StopReason.STOP_REQUESTED if stopping() else StopReason.RUN_ENDED
                return plan
            plan.read += 1
            behind = policy_version - group.min_policy_version
            if 0 <= self.config.max_staleness < behind:
                self.counters["groups_stale"] += 1
                _log.info("stale group dropped", group_id=group.group_id, versions_behind=behind)
                continue
            try:
                samples = group_samples(
                    group,
                    run_id=self.run_id,
                    advantage=AdvantageKind(self.config.advantage),
                    first_index=sum(len(kept.samples) for kept in plan.groups),
                )
            except BadGroupError as error:
                plan.error = error.message
                return plan
            self.counters["sessions_dropped"] += samples.dropped_sessions
            if samples.has_signal:
                plan.groups.append(samples)
                without_signal = 0
                continue
            plan.no_signal += 1
            plan.no_signal_rewards += samples.rewards
            without_signal += 1
            _log.info("group without signal dropped", group_id=samples.group_id, rewards=samples.rewards)
            if 0 < limit <= without_signal:
                plan.stop = StopReason.NO_SIGNAL
                return plan
        return plan

    def count_consumed(self, plan: Plan) -> None:
        """A plan's groups without signal join the totals once its step is trained or skipped."""
        self.counters["groups_no_signal"] += plan.no_signal

    def batches(self, plan: Plan) -> StepBatches:
        """The plan's groups as training sequences (builders/), packed into micro-batches of at most
        `micro_batch_tokens` tokens (a longer sequence split into parts: split.py). Raises BadGroupError
        before anything changed (a token id beyond the vocabulary)."""
        sequences, stats = build_step(plan.groups, BuilderKind(self.config.builder), self.vocab_size)
        micro_batches, split = pack_step(sequences, self.config.micro_batch_tokens)
        if split.over_budget_parts:
            _log.warning(
                "micro-batch over budget: a path from the root is longer than the budget",
                parts=split.over_budget_parts,
                tokens=split.longest_part,
                micro_batch_tokens=self.config.micro_batch_tokens,
            )
        return StepBatches(micro_batches, stats, split)
