"""An hour of chaos (issue 44): the quickstart's training run on a stack of every kind of process, with a seeded
fault schedule, and the checks made afterwards from durable state (docs/chaos.md).

    python bench/chaos.py --duration 3600 --seed 1 [--work DIR] [--json OUT]
    python bench/chaos.py --short --seed 44      # the test's round: every kind once, in minutes

The stack (bench/chaos_stack.py): three etcd members, two inference replicas found through etcd, two rollout
instances on one store, two gateway nodes, the trainer. Faults start once the trainer has done its first step
and go on for `--duration` seconds, one after another (bench/chaos_faults.py); `--short` does one round of
`short_round` instead. After the last fault the run waits for the trainer's first step after it (and after its
last restart), then the stack is stopped and the checks run (bench/chaos_checks.py), the last of them against an
unbroken twin of the trainer (bench/chaos_twin.py); the fault schedule and a table of what each check found are
printed, and the exit status is 1 when a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos_checks import Check, run_checks
from bench.chaos_faults import KINDS, Fault, Injector, schedule, short_round
from bench.chaos_stack import ChaosStack
from bench.chaos_twin import unbroken_twin

FIRST_STEP_TIMEOUT_S = 600.0
SETTLE_S = 5.0
"""After the last fault and the trainer's step since its last restart: time for the processes restarted last to
come back before the stack is stopped."""


@dataclass
class Report:
    seed: int
    duration_s: float
    faults: list[Fault] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def _last_start(stack: ChaosStack) -> float:
    return max(when for when, event in stack.procs["trainer"].timeline if event == "start")


def _step_since(stack: ChaosStack, started: float, timeout: float) -> None:
    """Wait until the trainer has logged a step after `started` (a restarted trainer imports torch again and
    resumes: on a loaded machine minutes); raises when it exits first or none comes in `timeout`."""
    metrics = stack.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = metrics.read_text() if metrics.exists() else ""
        lines = text[: text.rfind("\n") + 1].splitlines()  # whole lines: the last may be being written
        if any(float(json.loads(line)["time"]) > started for line in lines if line.strip()):
            return
        if not stack.procs["trainer"].alive:
            raise RuntimeError(f"the trainer exited before a step (see {stack.procs['trainer'].log})")
        time.sleep(1.0)
    raise RuntimeError(f"no trainer step within {timeout:.0f} s")


def run(
    work: Path,
    *,
    duration_s: float | None,
    seed: int,
    rounds: int | None = None,
    short: bool = False,
    model: Path | None = None,
    kinds: tuple[str, ...] = KINDS,
    out: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Report:
    """Start the stack under `work`, inject faults for `duration_s` (or `rounds` rounds of every kind, or with
    `short` the one round of `short_round`, however long they take), stop it, check; the report."""
    started = time.monotonic()
    report = Report(seed, duration_s or 0.0)
    stack = ChaosStack(work)
    faults = short_round(seed) if short else schedule(seed, len(kinds) * (rounds or 100_000), kinds)
    try:
        stack.start(model=model)
        _step_since(stack, _last_start(stack), FIRST_STEP_TIMEOUT_S)
        injector = Injector(stack, seed)
        end = time.monotonic() + (duration_s or float("inf"))
        for fault in faults:
            if time.monotonic() + fault.gap_s >= end:
                break
            time.sleep(fault.gap_s)
            injector.inject(fault)
            report.faults.append(fault)
            out(_fault_line(len(report.faults), fault))
        last = max([_last_start(stack), *(fault.at for fault in report.faults)])
        with contextlib.suppress(RuntimeError):  # the check "trainer kept training" says what was missing
            _step_since(stack, last, FIRST_STEP_TIMEOUT_S)
        time.sleep(SETTLE_S)
    finally:
        stopped_at = time.time()
        stack.stop()
        timelines = {name: proc.timeline for name, proc in stack.procs.items()}
        (work / "timelines.json").write_text(json.dumps(timelines) + "\n")  # when each process lived
    report.checks = [*run_checks(stack, report.faults, stopped_at), unbroken_twin(stack)]
    report.wall_s = round(time.monotonic() - started, 1)
    report.duration_s = round(report.duration_s or stopped_at - SETTLE_S - report.faults[0].at, 1)
    return report


def _fault_line(index: int, fault: Fault) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(fault.at))
    return f"{index:3d} {stamp} +{fault.gap_s:4.1f}s {fault.kind:22s} {fault.target:12s} {fault.hit}"


def _verdict(check: Check) -> str:
    return "n/a (too short)" if not check.judged else "pass" if check.ok else "FAIL"


def table(report: Report) -> str:
    """The fault counts by kind and the checks, as Markdown."""
    lines = [
        f"seed {report.seed}, {report.duration_s:.0f} s of faults, {len(report.faults)} faults, "
        f"{report.wall_s:.0f} s wall",
        "",
    ]
    counts: dict[str, int] = {}
    missed: dict[str, int] = {}
    for fault in report.faults:
        counts[fault.kind] = counts.get(fault.kind, 0) + 1
        missed[fault.kind] = missed.get(fault.kind, 0) + fault.hit.startswith("missed")
    lines += ["| fault | done | missed |", "|---|---|---|"]
    lines += [f"| {kind} | {counts[kind] - missed[kind]} | {missed[kind]} |" for kind in sorted(counts)]
    lines += ["", "| check | result | found |", "|---|---|---|"]
    lines += [f"| {c.name} | {_verdict(c)} | {c.found} |" for c in report.checks]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds of faults (after the first step)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=None, help="instead: this many rounds of every kind of fault")
    parser.add_argument("--short", action="store_true", help="instead: the test's short round (short_round)")
    parser.add_argument("--work", type=Path, default=None, help="where the stack keeps its logs and stores")
    parser.add_argument("--model", type=Path, default=None, help="a tiny model directory to use (default: build one)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="lodestar-chaos-"))
    length = "the short round" if args.short else f"{args.rounds} rounds" if args.rounds else f"{args.duration:.0f} s"
    print(f"chaos: seed {args.seed}, {length} of faults, work dir {work}", flush=True)
    duration = None if args.rounds or args.short else args.duration
    report = run(work, duration_s=duration, seed=args.seed, rounds=args.rounds, short=args.short, model=args.model)
    print(table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
