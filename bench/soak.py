"""Soak benchmark of one rollout service (issue 27): memory, store size and dispatch rate as history grows.

One real `lodestar rollout serve` process (real etcd from `lodestar_app.local`, SQLite store) and `--nodes`
simulated nodes in this process (each with its own etcd lease and channel, as in bench/rollout.py): every
node acquires up to `--slots` sessions and completes each at once (full dispatch speed) with a result of
`--calls` calls, each with `--prompt-tokens` prompt token ids, `--completion-tokens` sampled ids and their
logprobs and a `--body-bytes` request body (defaults: about 19 KB per session as sent). Runs of
`--run-sessions` sessions follow one another, two queued at a time, and a
trainer-like reader streams every run's groups (tokens only), so delivered groups leave the service's
memory. At each checkpoint (sessions completed) it records the service's RSS (VmRSS of its process), the
store's size on disk (file + WAL) and the dispatch rate (sessions handed out per second over the last
`--window` sessions). With the default run size the checkpoints fall mid-run, where the live work is the
same: half of one run and all of the next. It also records the service's CPU time per session since the
previous checkpoint (user + system, the whole process and its main thread, where the event loop runs): on a
shared machine the dispatch rate measures how much CPU the service got, the CPU per session what it needs
(1,000 / main-thread ms per session is the rate one core for the event loop would sustain).

Usage: `.venv/bin/python bench/soak.py --sessions 50000 [--checkpoints 10000,50000] [--repeat 3]
[--log bench/results/soak-DATE.md]`; prints one table per repetition and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rollout import _spec  # noqa: E402
from lodestar.etcd import EtcdClient  # noqa: E402
from lodestar.grpc.client import connect  # noqa: E402
from lodestar.logging import configure_logging  # noqa: E402
from lodestar.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc  # noqa: E402
from lodestar_app.local import LocalCluster, ServiceSpec, find_etcd, free_port  # noqa: E402

RUNS_QUEUED = 2
"""Runs kept created and not finished at once (the next starts while the last one's stragglers finish)."""


@dataclass(frozen=True)
class Shape:
    """What one simulated session reports."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    body_bytes: int

    def result(self) -> rollout_pb2.SessionResult:
        """A result template (session id, attempt and node are filled in per session)."""
        result = rollout_pb2.SessionResult(outcome=rollout_pb2.SESSION_OUTCOME_SCORED, reward=1.0)
        body = '{"messages": [{"role": "user", "content": "' + "x" * self.body_bytes + '"}]}'
        for sequence in range(self.calls):
            result.calls.append(
                common_pb2.CallRecord(
                    sequence=sequence,
                    continued_from_sequence=sequence - 1,
                    original_request_json=body,
                    prompt_token_ids=[(7 * i) % 50000 for i in range(self.prompt_tokens)],
                    completion_token_ids=[(11 * i) % 50000 for i in range(self.completion_tokens)],
                    completion_logprobs=[-0.1 - i * 1e-4 for i in range(self.completion_tokens)],
                )
            )
        return result


@dataclass
class Checkpoint:
    sessions: int
    rss_mb: float
    store_mb: float
    dispatch_per_s: float
    live_sessions: int
    """Sessions in the service's runs that are not finished (its live work), from GetRun."""
    cpu_ms: float = 0.0
    """The service's CPU time (user + system, every thread) per session completed since the last checkpoint."""
    main_cpu_ms: float = 0.0
    """The same for its main thread alone (the event loop: gRPC, scheduling; not the store's thread)."""


@dataclass
class Progress:
    handed: list[float] = field(default_factory=list)
    """Time of each hand-out."""
    completed: int = 0
    result_bytes: int = 0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(stat: Path) -> float:
    """User + system CPU seconds of a process or thread (/proc/PID/stat or /proc/PID/task/TID/stat)."""
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _store_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 1e6


async def _node(
    stub: rollout_pb2_grpc.RolloutServiceAsyncStub,
    etcd: EtcdClient,
    node_id: str,
    slots: int,
    template: rollout_pb2.SessionResult,
    done: asyncio.Event,
    progress: Progress,
) -> None:
    lease = await etcd.grant_lease(60)
    result = rollout_pb2.SessionResult()
    result.CopyFrom(template)
    result.node_id = node_id
    try:
        while not done.is_set():
            reply = await stub.AcquireSessions(
                rollout_pb2.AcquireSessionsRequest(node_id=node_id, lease_id=lease.id, free_slots=slots), timeout=60
            )
            now = time.perf_counter()
            progress.handed.extend([now] * len(reply.sessions))
            if not reply.sessions:
                await asyncio.sleep(0.02)
                continue
            for assignment in reply.sessions:
                result.session_id, result.attempt = assignment.session_id, assignment.attempt
                for call in result.calls:
                    call.session_id = assignment.session_id
                request = rollout_pb2.CompleteSessionRequest(result=result)
                await stub.CompleteSession(request, timeout=60)
                progress.completed += 1
                progress.result_bytes += result.ByteSize()
    finally:
        await lease.revoke()


async def _trainer(stub: rollout_pb2_grpc.RolloutServiceAsyncStub, run_id: str) -> None:
    """Read the run's groups (tokens only) to the end of the stream, as a trainer does."""
    request = rollout_pb2.StreamGroupsRequest(run_id=run_id, tokens_only=True)
    async for _ in stub.StreamGroups(request, timeout=3600):
        pass


async def _runs(stub: rollout_pb2_grpc.RolloutServiceAsyncStub, run_sessions: int, group_size: int) -> None:
    """Create runs of `run_sessions` one after another, `RUNS_QUEUED` running at once, each with a trainer
    reading its stream, until cancelled."""
    running: list[str] = []
    trainers: list[asyncio.Task[None]] = []
    try:
        while True:
            for run_id in list(running):
                run = (await stub.GetRun(rollout_pb2.GetRunRequest(run_id=run_id), timeout=60)).run
                if run.state != rollout_pb2.RUN_STATE_RUNNING:
                    running.remove(run_id)
            if len(running) >= RUNS_QUEUED:
                await asyncio.sleep(0.5)
                continue
            run = (await stub.CreateRun(rollout_pb2.CreateRunRequest(spec=_spec(run_sessions, group_size)))).run
            running.append(run.run_id)
            trainers.append(asyncio.create_task(_trainer(stub, run.run_id)))
    finally:
        for task in trainers:
            task.cancel()
        await asyncio.gather(*trainers, return_exceptions=True)


async def soak(args: argparse.Namespace) -> list[Checkpoint]:
    shape = Shape(args.calls, args.prompt_tokens, args.completion_tokens, args.body_bytes)
    template = shape.result()
    checkpoints = sorted({*(c for c in args.checkpoints if c < args.sessions), args.sessions})
    out: list[Checkpoint] = []
    with tempfile.TemporaryDirectory(prefix="bench-soak-", dir=args.tmp) as tmp:
        store = Path(tmp) / "rollout.sqlite"
        cluster = LocalCluster(Path(tmp), etcd_binary=find_etcd())
        await cluster.start_etcd()
        spec = ServiceSpec("rollout", free_port(), ["--etcd", cluster.etcd_url, "--store", str(store)])
        try:
            await cluster.start_services([spec])
            pid = cluster._processes["rollout"].pid  # the service's own process, for its RSS
            async with EtcdClient(cluster.etcd_url) as etcd:
                channels = [connect(f"127.0.0.1:{spec.port}") for _ in range(args.nodes)]
                stubs = [rollout_pb2_grpc.RolloutServiceStub(channel) for channel in channels]
                progress = Progress()
                done = asyncio.Event()
                runs = asyncio.create_task(_runs(stubs[0], args.run_sessions, args.group_size))
                nodes = [
                    asyncio.create_task(_node(stubs[i], etcd, f"node-{i}", args.slots, template, done, progress))
                    for i in range(args.nodes)
                ]
                started = time.perf_counter()
                process_stat, main_stat = Path(f"/proc/{pid}/stat"), Path(f"/proc/{pid}/task/{pid}/stat")
                last_cpu, last_main, last_done = _cpu_s(process_stat), _cpu_s(main_stat), progress.completed
                for target in checkpoints:
                    while progress.completed < target:  # counts other tasks' work
                        if runs.done() and runs.exception():
                            raise RuntimeError("run creation failed") from runs.exception()
                        await asyncio.sleep(0.05)
                    window = progress.handed[max(0, target - args.window) : target]
                    rate = (len(window) - 1) / (window[-1] - window[0]) if len(window) > 1 else 0.0
                    listed = (await stubs[0].ListRuns(rollout_pb2.ListRunsRequest(), timeout=60)).runs
                    live = sum(r.sessions_total for r in listed if r.state == rollout_pb2.RUN_STATE_RUNNING)
                    cpu, main, done_now = _cpu_s(process_stat), _cpu_s(main_stat), progress.completed
                    sessions = max(done_now - last_done, 1)
                    point = Checkpoint(
                        target,
                        _rss_mb(pid),
                        _store_mb(store),
                        rate,
                        live,
                        (cpu - last_cpu) * 1e3 / sessions,
                        (main - last_main) * 1e3 / sessions,
                    )
                    last_cpu, last_main, last_done = cpu, main, done_now
                    out.append(point)
                    elapsed = time.perf_counter() - started
                    print(
                        f"  {target:>7} sessions  rss {point.rss_mb:7.1f} MB  store {point.store_mb:8.1f} MB  "
                        f"dispatch {rate:6.0f}/s  live {live}  cpu {point.cpu_ms:.2f} ms/session "
                        f"(main {point.main_cpu_ms:.2f})  ({elapsed:.0f} s, "
                        f"{progress.result_bytes / max(progress.completed, 1) / 1e3:.1f} KB/result)",
                        flush=True,
                    )
                runs.cancel()
                done.set()
                await asyncio.gather(runs, *nodes, return_exceptions=True)
                for channel in channels:
                    await channel.close()
        finally:
            await cluster.stop()
    return out


def _table(rows: list[list[Checkpoint]]) -> str:
    lines = [
        "| sessions of history | rollout RSS (MB) | store size (MB) | dispatch (sessions/s) | live sessions "
        "| CPU ms / session (main thread) |",
        "|---|---|---|---|---|---|",
    ]
    for index, first in enumerate(rows[0]):
        points = [row[index] for row in rows if index < len(row)]
        lines.append(
            f"| {first.sessions:,} | {statistics.median(p.rss_mb for p in points):.1f} | "
            f"{statistics.median(p.store_mb for p in points):.0f} | "
            f"{statistics.median(p.dispatch_per_s for p in points):.0f} | "
            f"{statistics.median(p.live_sessions for p in points):.0f} | "
            f"{statistics.median(p.cpu_ms for p in points):.2f} "
            f"({statistics.median(p.main_cpu_ms for p in points):.2f}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50_000, help="sessions through the service in all")
    parser.add_argument(
        "--checkpoints",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[10_000, 50_000, 100_000, 200_000],
        help="sessions completed at which to measure (comma-separated)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (the table shows medians)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument(
        "--run-sessions", type=int, default=4_000, help="sessions per run (4,000: checkpoints fall mid-run)"
    )
    parser.add_argument("--calls", type=int, default=4, help="calls per session")
    parser.add_argument("--prompt-tokens", type=int, default=1_000)
    parser.add_argument("--completion-tokens", type=int, default=250)
    parser.add_argument("--body-bytes", type=int, default=1_000)
    parser.add_argument("--window", type=int, default=5_000, help="sessions over which dispatch is measured")
    parser.add_argument("--tmp", default=None, help="folder for the store and etcd (default: the system's)")
    parser.add_argument("--log", type=Path, default=None, help="append the raw results (Markdown) to this file")
    args = parser.parse_args()
    configure_logging("error")
    rows: list[list[Checkpoint]] = []
    started = datetime.now(UTC)
    for repetition in range(args.repeat):
        print(f"repetition {repetition + 1}/{args.repeat}", flush=True)
        rows.append(asyncio.run(soak(args)))
    table = _table(rows)
    print(table)
    if args.log is not None:
        raw = "\n".join(
            f"- repetition {i + 1}: "
            + "; ".join(
                f"{p.sessions}: rss {p.rss_mb:.1f} MB, store {p.store_mb:.1f} MB, dispatch {p.dispatch_per_s:.0f}/s, "
                f"live {p.live_sessions}, cpu {p.cpu_ms:.2f} ms/session (main {p.main_cpu_ms:.2f})"
                for p in row
            )
            for i, row in enumerate(rows)
        )
        command = " ".join(["bench/soak.py", *sys.argv[1:]])
        with args.log.open("a") as log:
            log.write(
                f"\n## {started:%Y-%m-%d %H:%M} UTC: `{command}`\n\n{raw}\n\nMedians over {args.repeat}:\n\n{table}\n"
            )


if __name__ == "__main__":
    main()
