"""What `lodestar train` shows: a live rich view on a terminal, plain lines elsewhere, and the summary.

`Progress` is one snapshot (trainer GetStatus + rollout GetRun); `render` makes the live view of it,
`plain_line` one log line per trainer step (readable in CI logs and pipes), `summary` the final table.
`reward_rise` is the mean reward of the last 5 steps minus that of the first 5 (of a run shorter than 15 steps,
its first and last third).

The "logprob gap" shown is the trainer-vs-inference mismatch on tokens sampled by the policy version the step
updates (`logprob_diff_mean`: float noise when all is well, a bug when not); the difference on stale tokens is
the policy's own drift since sampling, shown apart as "policy drift" next to the staleness (`policy_drift_mean`,
`staleness_mean`; services/trainer/lodestar_trainer/step/mismatch.py, docs/trainer.md).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from lodestar.v1 import rollout_pb2, trainer_pb2

WINDOW = 5


@dataclass
class Progress:
    run_id: str
    steps: int
    started: float = field(default_factory=time.monotonic)
    trainer: trainer_pb2.GetStatusResponse = field(default_factory=trainer_pb2.GetStatusResponse)
    run: rollout_pb2.Run = field(default_factory=rollout_pb2.Run)

    @property
    def values(self) -> dict[str, float]:
        return dict(self.trainer.last_metrics.values)

    @property
    def state(self) -> str:
        return trainer_pb2.TrainerState.Name(self.trainer.state).removeprefix("TRAINER_STATE_").lower()


def _value(values: dict[str, float], name: str, fmt: str) -> str:
    return format(values[name], fmt) if name in values else "-"


def render(progress: Progress) -> Group:
    """The live view: sessions, then the trainer's last step."""
    run, values = progress.run, progress.values
    elapsed = time.monotonic() - progress.started
    sessions = Table(title=f"run {progress.run_id}  ({elapsed:.0f} s)", show_edge=False)
    for column in ("running", "ready", "scored", "infra-failed", "groups done", "delivered", "dropped"):
        sessions.add_column(column, justify="right")
    sessions.add_row(
        str(run.sessions_running - run.sessions_ready),
        str(run.sessions_ready),
        str(run.sessions_succeeded),
        str(run.infra_failures),
        str(run.groups_complete),
        str(run.groups_delivered),
        str(run.groups_dropped),
    )
    trainer = Table(title=f"trainer: {progress.state}", show_edge=False)
    cells = {
        "step": f"{progress.trainer.step}/{progress.steps}",
        "reward mean": _value(values, "reward_mean", ".3f"),
        "pass rate": _value(values, "pass_rate", ".2f"),  # not logged for partial-credit rewards
        "tokens/s": _value(values, "tokens_per_second", ".0f"),
        "merge ratio": _value(values, "merge_ratio", ".2f"),
        "logprob gap": _value(values, "logprob_diff_mean", ".2g"),
        "policy drift": _value(values, "policy_drift_mean", ".2g"),
        "staleness": _value(values, "staleness_mean", ".2f"),
        "policy": str(progress.trainer.policy_version),
        "s/step": _value(values, "time_step", ".1f"),
    }
    if values and "pass_rate" not in values:
        del cells["pass rate"]
    for column in cells:
        trainer.add_column(column, justify="right")
    trainer.add_row(*cells.values())
    if progress.trainer.warning:
        return Group(sessions, trainer, Text(f"WARNING {progress.trainer.warning}", style="bold red"))
    return Group(sessions, trainer)


def plain_line(progress: Progress) -> str:
    """One line per step for a non-terminal output."""
    run, values = progress.run, progress.values
    return (
        f"step {progress.trainer.step}/{progress.steps}"
        f"  reward {_value(values, 'reward_mean', '.3f')}"
        + (f"  pass {values['pass_rate']:.2f}" if "pass_rate" in values else "")
        + f"  tokens/s {_value(values, 'tokens_per_second', '.0f')}"
        f"  merge {_value(values, 'merge_ratio', '.2f')}"
        f"  logprob gap {_value(values, 'logprob_diff_mean', '.2g')}"
        f"  drift {_value(values, 'policy_drift_mean', '.2g')} staleness {_value(values, 'staleness_mean', '.2f')}"
        f"  policy v{progress.trainer.policy_version}"
        f"  sessions running {run.sessions_running - run.sessions_ready} ready {run.sessions_ready}"
        f" scored {run.sessions_succeeded}"
        f"  [{time.monotonic() - progress.started:.0f} s]"
        + (f"\nWARNING {progress.trainer.warning}" if progress.trainer.warning else "")
    )


def windows(rewards: list[float]) -> tuple[list[float], list[float]]:
    """The first and the last WINDOW rewards; a run shorter than 3 x WINDOW steps compares its first and last
    third, so the start and the end are measured apart from the learning between them (a run whose tasks were
    used up right after a take-off at step 8 of 9 compares steps 1-3 with 7-9, where halves would blur the end
    into 5-9). One step: itself twice."""
    size = max(1, min(WINDOW, len(rewards) // 3))
    return rewards[:size], rewards[-size:]


def reward_rise(rewards: list[float]) -> float:
    """Mean of the last window of rewards minus the mean of the first (`windows`; 0 with no rewards)."""
    if not rewards:
        return 0.0
    first, last = windows(rewards)
    return sum(last) / len(last) - sum(first) / len(first)


@dataclass(frozen=True)
class Gaps:
    """The run's trainer-vs-inference mismatch and policy drift over its steps (module docstring)."""

    gap_max: float | None = None
    """Largest step `logprob_diff_max` (same-version tokens); None: no step had any."""
    gap_steps: int = 0
    drift_mean: float | None = None
    """Mean over steps of `policy_drift_mean` (stale tokens); None: no step had any."""
    staleness_mean: float | None = None


def gaps(records: Iterable[dict[str, float]]) -> Gaps:
    """The `Gaps` of a run's metrics records."""
    items = list(records)
    gap = [r["logprob_diff_max"] for r in items if "logprob_diff_max" in r]
    drift = [r["policy_drift_mean"] for r in items if "policy_drift_mean" in r]
    stale = [r["staleness_mean"] for r in items if "staleness_mean" in r]
    return Gaps(
        gap_max=max(gap) if gap else None,
        gap_steps=len(gap),
        drift_mean=sum(drift) / len(drift) if drift else None,
        staleness_mean=sum(stale) / len(stale) if stale else None,
    )


def run_records(run_dir: Path) -> list[dict[str, float]]:
    """The records of `<run_dir>/metrics.jsonl` (none when the file is missing)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_gaps(run_dir: Path) -> Gaps:
    """`gaps` of `<run_dir>/metrics.jsonl` (empty when the file is missing)."""
    return gaps(run_records(run_dir))


@dataclass(frozen=True)
class Costs:
    """What the run's steps cost: tokens per group and where the time between steps went."""

    prompt_tokens: float = 0.0
    """Mean prompt tokens per call (a harness's system prompt and tools are most of them)."""
    trained_per_group: float = 0.0
    """Tokens the trainer computed per group (the builder's sequences)."""
    calls_per_group: float = 0.0
    """Tokens in the group's calls, prompt + sampled, one by one: what a linear builder would compute."""
    step_seconds: float = 0.0
    """Median wall time of a step (its own time: build, forward/backward, optimizer, push)."""
    push_share: float = 0.0
    wait_share: float = 0.0
    """Shares of the wall time from the first step's record to the last spent pushing weights and waiting
    for groups (the time between steps that was not the step's own)."""
    memory_peak_mb: float = 0.0
    """The trainer process's peak resident memory (metrics `memory_peak_mb`; 0 in runs from before it)."""


def costs(records: Iterable[dict[str, float]]) -> Costs:
    """The `Costs` of a run's metrics records (zeros without any)."""
    items = [r for r in records if r.get("groups")]
    if not items:
        return Costs()
    groups = sum(r["groups"] for r in items)
    calls = sum(r.get("calls", 0.0) for r in items)
    sampled = sum(r.get("target_tokens", 0.0) for r in items)
    in_calls = sum(r.get("call_tokens", 0.0) for r in items)
    span = items[-1]["time"] - items[0]["time"] + items[0].get("time_step", 0.0) if "time" in items[0] else 0.0
    own = sum(r.get("time_step", 0.0) for r in items)
    return Costs(
        prompt_tokens=(in_calls - sampled) / calls if calls else 0.0,
        trained_per_group=sum(r.get("tokens_trained", 0.0) for r in items) / groups,
        calls_per_group=in_calls / groups,
        step_seconds=statistics.median(r.get("time_step", 0.0) for r in items),
        push_share=sum(r.get("time_push", 0.0) for r in items) / span if span > 0 else 0.0,
        wait_share=max(span - own, 0.0) / span if span > 0 else 0.0,
        memory_peak_mb=max(r.get("memory_peak_mb", 0.0) for r in items),
    )


@dataclass(frozen=True)
class Outcome:
    """What the summary names."""

    run_id: str
    state: str
    steps: int
    run_dir: Path
    checkpoint: str
    metrics: list[Path]
    plots: list[Path]
    rewards: list[float]
    merge_ratio: float
    seconds: float
    error: str = ""
    warning: str = ""
    """The trainer's standing warning (trainer-vs-inference logprob mismatch), shown in red."""
    note: str = ""
    """Why the training ended before its steps without an error (the run's groups ran out, or no reward signal
    was left in them)."""
    gaps: Gaps = field(default_factory=Gaps)
    costs: Costs = field(default_factory=Costs)


def summary(outcome: Outcome) -> Table:
    table = Table(title=f"lodestar train: {outcome.state}", show_header=False, show_edge=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("run", outcome.run_id),
        ("steps", str(outcome.steps)),
        ("time", f"{outcome.seconds:.0f} s"),
        (f"reward first {len(windows(outcome.rewards)[0])} -> last", _rise_text(outcome.rewards)),
        ("reward rise", f"{reward_rise(outcome.rewards):+.3f}"),
        ("merge ratio (mean)", f"{outcome.merge_ratio:.2f}"),
        ("tokens per group", _tokens_text(outcome.costs)),
        ("time per step", _time_text(outcome.costs)),
        ("logprob gap (max)", _gap_text(outcome.gaps)),
        ("policy drift (mean)", _drift_text(outcome.gaps)),
        ("run directory", str(outcome.run_dir)),
        ("final checkpoint", outcome.checkpoint or "-"),
        ("metrics", ", ".join(str(p) for p in outcome.metrics) or "-"),
        ("reward plot", str(outcome.plots[0]) if outcome.plots else "-"),
    ]
    if outcome.note:
        rows.append(("ended", outcome.note))
    if outcome.error:
        rows.append(("error", outcome.error))
    for row in rows:
        table.add_row(*row)
    if outcome.warning:
        table.add_row("warning", Text(outcome.warning, style="bold red"))
    return table


def _rise_text(rewards: list[float]) -> str:
    if not rewards:
        return "-"
    first, last = windows(rewards)
    return f"{sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f}"


def _tokens_text(found: Costs) -> str:
    if not found.trained_per_group:
        return "-"
    return (
        f"{found.trained_per_group:,.0f} trained, {found.calls_per_group:,.0f} in its calls one by one "
        f"({found.prompt_tokens:,.0f} prompt tokens per call)"
    )


def _time_text(found: Costs) -> str:
    if not found.step_seconds:
        return "-"
    memory = f"; trainer peak memory {found.memory_peak_mb:,.0f} MB" if found.memory_peak_mb else ""
    return (
        f"{found.step_seconds:.0f} s median; pushing {found.push_share:.0%}, waiting for groups {found.wait_share:.0%}"
        + memory
    )


def _gap_text(found: Gaps) -> str:
    if found.gap_max is None:
        return "- (no step trained on tokens of its own policy version)"
    return f"{found.gap_max:.2g} nats, same-version tokens of {found.gap_steps} steps"


def _drift_text(found: Gaps) -> str:
    staleness = "-" if found.staleness_mean is None else f"{found.staleness_mean:.2f}"
    if found.drift_mean is None:
        return f"- (no stale tokens); staleness {staleness}"
    return f"{found.drift_mean:.2g} nats on stale tokens; staleness {staleness}"
