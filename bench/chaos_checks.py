"""The chaos run's checks, made after the stack stopped, from what it left on disk: the rollout store (SQLite),
the trainer's metrics.jsonl and checkpoints, the services' JSON logs and the processes' timelines
(bench/chaos.py; what each check means: docs/chaos.md).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.chaos_faults import Fault
from bench.chaos_stack import ChaosStack, Proc
from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_app.cli.train_view import reward_rise

ERROR_WINDOW_S = 60.0
"""An error logged within this long after a fault (or a restart it caused) is accounted for by it."""
PUBLISHED = "policy version published"
REGISTERED = "inference replica registered in etcd"
PUSHED = (
    "weights pushed",
    "weights pushed (changed only)",
    "resumed weights pushed",
    "the run's versions were served past this state: its weights pushed past them",
)
"""The trainer's log lines of a finished push (weights/pushing.py; a resumed trainer's first push, control.py),
each with the push's `seconds`."""
GOOD_FINISH = (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP_SEQUENCE)


TAKE_OFF = 0.8
"""A step's mean reward from which the quickstart's policy has taken off (0.1-0.4 before, 0.95 after; the chaos
task's coin caps rewards at 0.8, so it changes nothing below)."""
QUICKSTART_TAKE_OFF = (4, 15)
"""The steps the quickstart's reward took off at: step 4 at the earliest in a dozen runs, 6-15 in six runs whose
step was noted (tests/e2e/test_quickstart.py)."""
MIN_STEPS_FOR_REWARD = QUICKSTART_TAKE_OFF[1] + 1
"""Fewer steps in the final lineage judge nothing (the check says n/a): the take-off may come at step 15."""


@dataclass
class Check:
    name: str
    ok: bool
    found: str
    judged: bool = True
    """False: the run was too short for this check to say anything (shown as n/a, not a pass)."""


def run_checks(stack: ChaosStack, faults: list[Fault], stopped_at: float) -> list[Check]:
    with sqlite3.connect(f"file:{stack.store}?mode=ro", uri=True) as db:
        results = _counted_results(db)
        checks = [_scored_once(db), _trained_once(db, stack), _no_cut_call(results)]
    heard = _heard(stack)
    checks += [_served_before_heard(stack, heard), _versions_forward(results, heard)]
    checks += [
        _trainer_trains(stack, faults),
        reward_rises([float(r["reward_mean"]) for r in lineage(stack.run_dir / "metrics.jsonl")]),
        _nothing_left(stack),
        _errors_accounted(stack, faults, stopped_at),
    ]
    return checks


def _counted_results(db: sqlite3.Connection) -> list[rollout_pb2.SessionResult]:
    found = []
    for (blob,) in db.execute("SELECT result FROM results WHERE counted = 1"):
        result = rollout_pb2.SessionResult()
        result.ParseFromString(blob)
        found.append(result)
    return found


def _scored_once(db: sqlite3.Connection) -> Check:
    twice = db.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM sessions GROUP BY run_id, task_index, sample HAVING COUNT(*) > 1)"
    ).fetchone()[0]
    counted_twice = db.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM results WHERE counted = 1 GROUP BY session_id HAVING COUNT(*) > 1)"
    ).fetchone()[0]
    scored = db.execute("SELECT COUNT(*) FROM sessions WHERE status = 'scored'").fetchone()[0]
    counted = db.execute("SELECT COUNT(*) FROM results WHERE counted = 1").fetchone()[0]
    ok = twice == 0 and counted_twice == 0 and counted == scored
    found = f"{scored} sessions scored, {counted} counted results; (task, sample) twice: {twice}; "
    return Check("scored at most once", ok, found + f"session counted twice: {counted_twice}")


def lineage(metrics: Path) -> list[dict[str, Any]]:
    """The steps of the final weights: a resumed trainer writes the steps after its checkpoint again; the
    last record of each step is the one its weights went on from."""
    steps: dict[int, dict[str, Any]] = {}
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        record = json.loads(line)
        steps[int(record["step"])] = record
        for later in [s for s in steps if s > int(record["step"])]:
            del steps[later]  # replaced by the resumed run's own
    return [steps[s] for s in sorted(steps)]


def _trained_once(db: sqlite3.Connection, stack: ChaosStack) -> Check:
    seqs = [row[0] for row in db.execute("SELECT delivery_seq FROM groups WHERE delivery_seq > 0 ORDER BY 1")]
    contiguous = seqs == list(range(1, len(seqs) + 1))
    steps = lineage(stack.run_dir / "metrics.jsonl")
    numbers = [int(r["step"]) for r in steps]
    trained = sum(int(r["groups"]) + int(r.get("groups_stale", 0)) for r in steps)
    ok = contiguous and numbers == list(range(1, len(numbers) + 1)) and trained <= len(seqs)
    found = f"{len(seqs)} groups delivered (sequence {'1..n' if contiguous else 'with gaps or repeats'}), "
    found += f"steps 1..{len(numbers)} in the final weights' lineage, {trained} groups read by them"
    return Check("trained at most once", ok, found)


def _no_cut_call(results: list[rollout_pb2.SessionResult]) -> Check:
    cut = 0
    for result in results:
        calls = sorted(result.calls, key=lambda c: c.sequence)
        whole = len(calls) >= 2 and all(
            c.completion_token_ids
            and len(c.completion_token_ids) == len(c.completion_logprobs)
            and c.finish_reason in GOOD_FINISH
            for c in calls
        )
        cut += not whole
    return Check(
        "no session scored from a cut call",
        cut == 0,
        f"{len(results)} counted results, {cut} with a cut or missing call",
    )


def _stamp(line: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


ETCD_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) ([DINWECP]) \| (.*)$")
"""etcd's text log line: local time, level letter, message."""
ETCD_LEVELS = {"E": "error", "C": "critical", "P": "panic", "W": "warning"}


def _etcd_line(raw: str) -> dict[str, Any] | None:
    match = ETCD_LINE.match(raw)
    if match is None:
        return None
    when = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S.%f").astimezone()
    return {"timestamp": when.isoformat(), "level": ETCD_LEVELS.get(match[2], "info"), "event": match[3]}


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """The log's lines as mappings with a timestamp (JSON lines, and etcd's text lines); others skipped."""
    found = []
    for raw in path.read_bytes().splitlines() if path.exists() else []:
        try:
            line = json.loads(raw)
        except ValueError:
            line = _etcd_line(raw.decode(errors="replace"))
        if isinstance(line, dict) and "ts" in line and "timestamp" not in line:  # etcd's own format
            line = {**line, "timestamp": str(line["ts"]), "event": line.get("msg", "")}
        if isinstance(line, dict) and "timestamp" in line:
            found.append(line)
    return found


def _heard(stack: ChaosStack) -> list[tuple[float, int]]:
    """(time, version) of every policy version report the rollout leaders logged."""
    heard = []
    for proc in stack.of_kind("rollout"):
        for line in _json_lines(proc.log):
            if line.get("event") == "policy version reported":
                heard.append((_stamp(line), int(line["policy_version"])))
    return sorted(heard)


def _alive_at(proc: Proc, at: float) -> bool:
    """Whether `proc` ran (started, not killed or stopped) at `at`, by its timeline."""
    state = False
    for when, event in proc.timeline:
        if when > at:
            break
        state = event in ("start", "cont")
    return state


def _push_starts(stack: ChaosStack) -> list[tuple[float, int]]:
    """(time, version) at which each of the trainers' logged pushes began: its log line's time less its seconds."""
    starts = []
    for proc in stack.of_kind("trainer"):
        for line in _json_lines(proc.log):
            if line.get("event") in PUSHED and "seconds" in line:
                starts.append((_stamp(line) - float(line["seconds"]), int(line["policy_version"])))
    return sorted(starts)


def _served_before_heard(stack: ChaosStack, heard: list[tuple[float, int]]) -> Check:
    """At each report of v, every replica that was running and registered in etcd since its last start, before
    the push of v began, had published v or newer. The trainer pushes to the replicas registered when a push
    begins, so one that registered during the push is not in it: the nodes do not route to it until it serves the
    fleet's version (lodestar_gateway/replica_watch.py) and the next push brings it up; whether any call was served
    older than rollout knew is `_versions_forward`'s check on the calls themselves. Such replicas are counted."""
    late, joined = [], 0
    pushes = _push_starts(stack)
    for proc in stack.of_kind("inference"):
        lines = _json_lines(proc.log)
        published = [(_stamp(x), int(x["policy_version"])) for x in lines if x.get("event") == PUBLISHED]
        registered = [_stamp(x) for x in lines if x.get("event") == REGISTERED]
        for at, version in heard:
            starts = [w for w, e in proc.timeline if e == "start" and w <= at]
            if not starts or not _alive_at(proc, at) or not any(starts[-1] <= w <= at for w in registered):
                continue
            served = max((v for w, v in published if starts[-1] <= w <= at), default=0)
            if served >= version:
                continue
            began = max((w for w, v in pushes if v == version and w <= at), default=None)
            if began is not None and all(w > began for w in registered if starts[-1] <= w <= at):
                joined += 1
                continue
            late.append(f"v{version} heard, {proc.name} served v{served}")
    found = f"{len(heard)} version reports; served late: {len(late)}" + (f" ({'; '.join(late[:3])})" if late else "")
    found += f"; registered during the push reported (not in it, not yet routed to): {joined}"
    return Check("pushed version served before rollout heard it", not late and bool(heard), found)


def _versions_forward(results: list[rollout_pb2.SessionResult], heard: list[tuple[float, int]]) -> Check:
    backwards = behind = 0
    for result in results:
        calls = sorted(result.calls, key=lambda c: c.sequence)
        versions = [c.policy_version for c in calls]
        backwards += versions != sorted(versions)
        for call in calls:
            started = call.started_at.seconds + call.started_at.nanos / 1e9
            known = max((v for at, v in heard if at < started), default=0)
            behind += call.policy_version < known
    found = f"{len(results)} sessions: {backwards} with a version going backwards, {behind} calls served older "
    return Check("policy version never backwards", backwards == 0 and behind == 0, found + "than rollout already knew")


def _trainer_trains(stack: ChaosStack, faults: list[Fault]) -> Check:
    """The trainer never failed, trained after its last start and after the last fault (a trainer that waits
    for ever, alive, fails this: the chaos hour's deadlock, docs/chaos.md), the longest it went without a step,
    and how long its kills kept it from a step."""
    trainer = stack.procs["trainer"]
    failed = [str(x.get("error", ""))[:100] for x in _json_lines(trainer.log) if x.get("event") == "trainer failed"]
    metrics = stack.run_dir / "metrics.jsonl"
    times = sorted(float(json.loads(x)["time"]) for x in metrics.read_text().splitlines()) if metrics.exists() else []
    kills = [when for when, event in trainer.timeline if event == "kill"]
    idle = sum(next((t for t in times if t > kill), kill) - kill for kill in kills)
    starts = [when for when, event in trainer.timeline if event == "start"]
    after = [t for t in times if t > starts[-1]] if starts else []
    last_fault = max((fault.at for fault in faults), default=0.0)
    after_faults = [t for t in times if t > last_fault]
    longest = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    found = f"{len(failed)} failures{f' ({failed[0]})' if failed else ''}, {len(after)} steps after its last start, "
    found += f"{len(after_faults)} after the last fault; longest without a step {longest:.0f} s; "
    found += f"{len(kills)} kills cost {idle:.0f} s until the next step"
    return Check("trainer kept training", not failed and bool(after) and bool(after_faults), found)


def reward_rises(rewards: list[float]) -> Check:
    """The final lineage's step rewards against the quickstart's rise: up, and its take-off (the first step at
    `TAKE_OFF` or more) no later than the quickstart's latest."""
    rise = reward_rise(rewards)
    take_off = next((step for step, reward in enumerate(rewards, 1) if reward >= TAKE_OFF), None)
    earliest, latest = QUICKSTART_TAKE_OFF
    found = "no step"
    if rewards:
        found = f"{len(rewards)} steps, reward {rewards[0]:.2f} -> {rewards[-1]:.2f}, rise {rise:+.2f}; "
        found += f"take-off ({TAKE_OFF}) at step {take_off}" if take_off else f"never at {TAKE_OFF}"
        found += f" (the quickstart's: steps {earliest}-{latest})"
    judged = len(rewards) >= MIN_STEPS_FOR_REWARD
    ok = rise > 0 and take_off is not None and take_off <= latest
    return Check("reward rises as the quickstart's", ok or not judged, found, judged=judged)


SANDBOX_MARK = "lodestar_gateway/node/harnesses/"
"""In the command line of a gateway node's session sandbox (bwrap around netns_child.py)."""


def _started_at(pid: str) -> float:
    """When process `pid` started (seconds since the epoch), from /proc."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def _nothing_left(stack: ChaosStack) -> Check:
    """No process names the run's work directory, and no orphaned session sandbox started during the run (a
    killed node's sandboxes are reparented to init: their command lines name the harness code, not the run)."""
    marker = str(stack.work)
    began = min((when for proc in stack.procs.values() for when, _ in proc.timeline), default=time.time())
    left = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            orphan = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == "1"
            sandbox = orphan and SANDBOX_MARK in cmdline and _started_at(pid) >= began
        except (OSError, IndexError, ValueError):
            continue
        if marker in cmdline or sandbox:
            left.append(f"{pid}: {cmdline[:80]}")
    found = f"{len(left)} processes naming {marker} or orphaned sandboxes of the run"
    return Check("no process left behind", not left, found + (f": {left[:2]}" if left else ""))


def _stalls(stack: ChaosStack) -> list[float]:
    """When etcd warned that a request took too long: the machine (not a fault) stalled the cluster then."""
    return [
        _stamp(line)
        for proc in stack.of_kind("etcd")
        for line in _json_lines(proc.log)
        if line.get("level") == "warning" and "took too long" in str(line.get("event", ""))
    ]


def _errors_accounted(stack: ChaosStack, faults: list[Fault], stopped_at: float) -> Check:
    """Every error line falls within ERROR_WINDOW_S after a fault began, after etcd saw the machine stall (a
    slow-request warning), or after the stop; the others are listed."""
    windows = [(f.at, f.at + f.seconds + ERROR_WINDOW_S) for f in faults] + [(stopped_at, float("inf"))]
    stalls = [(at, at + ERROR_WINDOW_S) for at in _stalls(stack)]
    unaccounted: list[str] = []
    counts = {"fault": 0, "stall": 0}
    for proc in stack.procs.values():
        for line in _json_lines(proc.log):
            if str(line.get("level", "")).lower() not in ("error", "critical", "fatal", "panic"):
                continue
            at = _stamp(line)
            if any(start <= at <= end for start, end in windows):
                counts["fault"] += 1
            elif any(start <= at <= end for start, end in stalls):
                counts["stall"] += 1
            else:
                unaccounted.append(f"{proc.name}: {str(line.get('event'))[:80]}")
    found = f"{counts['fault']} error lines after a fault or the stop, {counts['stall']} after etcd saw the machine "
    found += f"stall ({len(stalls)} slow-request warnings), {len(unaccounted)} unaccounted"
    return Check(
        "every log's errors accounted for", not unaccounted, found + (f": {unaccounted[:3]}" if unaccounted else "")
    )
