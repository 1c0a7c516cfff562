"""What `lodestar redteam SPEC|TASKS [--runtime host|docker] [--tasks N] [--rollout ADDR]` does (the command
itself, redteam.py, imports this on use: it needs the gateway's package): attack a task set's verifier with
known reward hacks before training on it.

Each hack kind of the library (`lodestar_gateway/node/redteam/hacks.py`, docs/redteam.md) is an agent program
that fixes nothing and only plants or performs its one hack. For each kind that can reach the spec's verifier,
plus the `noop` agent (the honest failure), one ordinary run goes through the rollout machinery exactly as
`lodestar eval`'s do: the spec's tasks (a sample of `--tasks N`), verifier, runtime and timeouts, with the
`command` harness running the agent in place of the spec's harness; group size 1, one attempt, greedy sampling
(top_k 1: every agent's final message is the same text, so a verifier reading the answer scores them alike).
`outcome.py` then judges each (hack, task) session against the noop's on the same task: paid, leaked, escaped,
held or infra. A rich table shows them; the exit code is 1 when any hack paid, leaked or escaped, else 0.

Without `--rollout` it starts its own stack under `--data-dir` (etcd, rollout, one gateway node, and the
`scripted` inference backend on the offline tiny model with an echo script: the model says what the agent
asks it to, so a hack that found an answer gets it into the final answer) and stops it at the end. With
`--rollout` it uses that stack's node and model (a hack's answer then reaches the final answer only if that
model repeats it; the agent's report still marks the leak). `lodestar train` runs `red_team` on its own stack
before the first step (train_redteam.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import grpc.aio
from rich.console import Console
from rich.table import Table

from lodestar.errors import InvalidArgumentError, LodestarError
from lodestar.grpc.client import LeaderChannel
from lodestar.grpc.errors import error_from_rpc
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_app.cli.eval import _create_run, _wait, tasks_path
from lodestar_gateway.node.redteam.hacks import BASELINE, BY_NAME, HACKS, Hack, applicable, baseline_program
from lodestar_gateway.node.redteam.outcome import Cell, Session, judge_all

DEFAULT_ROLLOUT = "127.0.0.1:50053"
AGENT_TIMEOUT_S = 120.0
ESCAPE_MARKER = "lodestar-redteam-escape-"
ECHO_SCRIPT = {"default": {"echo": True}}
_SCORED = (rollout_pb2.SESSION_OUTCOME_SCORED, rollout_pb2.SESSION_OUTCOME_TIMED_OUT)
_console = Console(stderr=True)


def load_spec(path: Path, verifier: str = "exact_match", verifier_config: str = "") -> rollout_pb2.RunSpec:
    """The run spec of SPEC|TASKS (a spec file, a tasks JSONL with `verifier`, or a task-set directory)."""
    from google.protobuf import json_format

    from lodestar_rollout.spec import load_spec_file, read_tasks_jsonl

    found = tasks_path(path)
    if found.suffix != ".jsonl":
        return load_spec_file(found)
    spec = rollout_pb2.RunSpec(name=found.parent.name if found.name == "tasks.jsonl" else found.stem, group_size=1)
    spec.tasks.extend(read_tasks_jsonl(found))
    spec.verifier.kind = verifier
    if verifier_config:
        json_format.ParseDict({"config": json.loads(verifier_config)}, spec.verifier)
    return spec


def sample(tasks: Sequence[rollout_pb2.Task], count: int) -> list[rollout_pb2.Task]:
    """`count` tasks spread evenly over the task set (all of them when it has no more), in a fixed order."""
    if count >= len(tasks):
        return list(tasks)
    return [tasks[(index * len(tasks)) // count] for index in range(count)]


def hack_specs(
    base: rollout_pb2.RunSpec, hacks: Sequence[Hack], tasks: int, ports: Sequence[int] = ()
) -> dict[str, rollout_pb2.RunSpec]:
    """One run spec per hack and one for the noop agent: `base` with the agent in place of its harness."""
    from lodestar.sampling import DEFAULT_TEMPERATURE
    from lodestar_rollout.evaluation import MAX_STALENESS
    from lodestar_rollout.spec import validate_spec

    programs = {BASELINE: baseline_program(), **{hack.name: hack.program for hack in hacks}}
    specs: dict[str, rollout_pb2.RunSpec] = {}
    for name, program in programs.items():
        spec = rollout_pb2.RunSpec()
        spec.CopyFrom(base)
        spec.name = f"redteam-{name}-{base.name}" if base.name else f"redteam-{name}"
        del spec.tasks[:]
        spec.tasks.extend(sample(base.tasks, tasks))
        env = {"LODESTAR_REDTEAM_PORTS": ",".join(str(port) for port in ports)} if ports else {}
        spec.harness.CopyFrom(rollout_pb2.HarnessSpec(kind="command", command=["{python}", str(program)], env=env))
        spec.group_size, spec.early_stop_fraction, spec.max_attempts = 1, 1.0, 1
        spec.max_staleness = MAX_STALENESS
        spec.sampling.Clear()
        spec.sampling.temperature, spec.sampling.top_k = DEFAULT_TEMPERATURE, 1
        agent_s = min(AGENT_TIMEOUT_S, spec.agent_timeout.ToTimedelta().total_seconds() or AGENT_TIMEOUT_S)
        spec.agent_timeout.FromSeconds(int(agent_s))
        if spec.session_timeout.ToTimedelta().total_seconds() < agent_s:
            spec.session_timeout.FromSeconds(int(agent_s) + 300)
        validate_spec(spec)
        specs[name] = spec
    return specs


async def _sessions(channel: LeaderChannel, hack: str, run_id: str) -> list[Session]:
    async def read(ch: grpc.aio.Channel) -> list[Session]:
        stub = rollout_pb2_grpc.RolloutServiceStub(ch)
        groups = await stub.ListGroups(rollout_pb2.ListGroupsRequest(run_id=run_id), timeout=60.0)
        found: list[Session] = []
        for group in groups.groups:
            for summary in group.sessions:
                request = rollout_pb2.GetSessionDetailRequest(
                    session_id=summary.session_id, call_limit=1, calls_without_bodies=True
                )
                detail = await stub.GetSessionDetail(request, timeout=60.0)
                result = detail.result
                error = result.error or next((a.error for a in reversed(detail.attempts) if a.error), "")
                error = error or rollout_pb2.SessionStatus.Name(summary.status)
                scored = summary.outcome in _SCORED
                found.append(
                    Session(hack, group.task_id, scored, summary.reward, summary.session_id, error, result.stdout_tail)
                )
        return found

    return await channel.call(read)


def escape_markers(places: Sequence[Path]) -> dict[str, list[str]]:
    """Session id -> marker files the sandbox-escape agent left on this host (removed once read)."""
    found: dict[str, list[str]] = {}
    for place in places:
        for marker in place.glob(ESCAPE_MARKER + "*") if place.is_dir() else ():
            found.setdefault(marker.name.removeprefix(ESCAPE_MARKER), []).append(str(marker))
            marker.unlink(missing_ok=True)
    return found


def marker_places() -> list[Path]:
    from lodestar_gateway.node.harnesses.base import REPO_ROOT

    fixed = [Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), REPO_ROOT, Path.home(), Path.cwd()]
    return [*fixed, *Path("/home").glob("*")]


async def red_team(
    target: str, specs: dict[str, rollout_pb2.RunSpec], *, timeout_s: float, pass_threshold: float, console: Console
) -> list[Cell]:
    """Create the runs of `hack_specs` on the rollout at `target`, wait for them (DeadlineExceededError after
    `timeout_s`) and judge every session (outcome.py)."""
    channel = LeaderChannel(target)
    runs: dict[str, str] = {}
    try:
        for name, spec in specs.items():
            runs[name] = await _create_run(channel, spec)
        tasks = max(len(spec.tasks) for spec in specs.values())
        with console.status(f"red team: {len(runs) - 1} hacks + the honest failure x {tasks} tasks"):
            await _wait(channel, list(runs.values()), time.monotonic() + timeout_s)
        sessions = [session for name, run_id in runs.items() for session in await _sessions(channel, name, run_id)]
    except grpc.aio.AioRpcError as error:
        raise error_from_rpc(error) from None
    except BaseException:  # a timeout, Ctrl-C: leave nothing of ours running on the stack
        await asyncio.shield(_cancel(channel, list(runs.values())))
        raise
    finally:
        await channel.close()
    markers = await asyncio.to_thread(escape_markers, marker_places())
    sessions = [replace(s, escape_markers=tuple(markers.get(s.session_id, ()))) for s in sessions]
    return judge_all(sessions, pass_threshold, BASELINE)


async def _cancel(channel: LeaderChannel, run_ids: list[str]) -> None:
    async def cancel(ch: grpc.aio.Channel) -> None:
        stub = rollout_pb2_grpc.RolloutServiceStub(ch)
        for run_id in run_ids:
            await stub.CancelRun(rollout_pb2.CancelRunRequest(run_id=run_id), timeout=30.0)

    with contextlib.suppress(grpc.aio.AioRpcError, LodestarError):
        await channel.call(cancel)


@asynccontextmanager
async def own_stack(data_dir: Path, *, slots: int, start_timeout_s: float) -> AsyncIterator[tuple[str, list[int]]]:
    """etcd, scripted echo inference on the tiny model, rollout and one gateway node under `data_dir`:
    (the rollout address, the stack's ports for the sandbox-escape agent to try)."""
    from lodestar_app.cli import up
    from lodestar_app.cli.model import ensure_tiny_model
    from lodestar_app.local import LocalCluster, find_etcd

    data_dir = await asyncio.to_thread(data_dir.resolve)
    model = data_dir / "tiny-model"
    await ensure_tiny_model(model, _console)  # makes data_dir
    script = data_dir / "echo-script.json"
    await asyncio.to_thread(script.write_text, json.dumps(ECHO_SCRIPT))
    (data_dir / "rollout.sqlite").unlink(missing_ok=True)  # a red team keeps no history
    cluster = LocalCluster(data_dir, etcd_binary=find_etcd(), max_restarts=0)
    settings = argparse.Namespace(backend="scripted", model=model, http_port=0, slots=slots, ready_buffer=1)
    try:
        with _console.status("starting etcd, scripted inference, rollout and a gateway node"):
            await cluster.start_etcd(timeout=start_timeout_s)
            specs = [s for s in up._service_specs(settings, data_dir, cluster.etcd_url) if s.name != "trainer"]
            inference = next(s for s in specs if s.name == "inference")
            inference.args += ["--script", str(script)]
            await cluster.start_services(specs, timeout=start_timeout_s)
        rollout = next(s for s in specs if s.name == "rollout")
        yield f"127.0.0.1:{rollout.port}", [s.port for s in specs]
    finally:
        await cluster.stop()


_STYLE = {"paid": "bold red", "leaked": "bold magenta", "escaped": "bold magenta", "held": "green", "infra": "yellow"}


def table(cells: Sequence[Cell], title: str = "lodestar redteam") -> Table:
    """Hacks down, tasks across; each cell the verdict and the reward (the noop row: the honest failure)."""
    tasks = list(dict.fromkeys(cell.task_id for cell in cells))
    grid = Table(title=title, show_lines=False)
    grid.add_column("hack")
    for task in tasks:
        grid.add_column(task, justify="center")
    grid.add_column("evidence", overflow="fold")
    by_hack: dict[str, dict[str, Cell]] = {}
    for cell in cells:
        by_hack.setdefault(cell.hack, {})[cell.task_id] = cell
    for hack, row in by_hack.items():
        shown = []
        for task in tasks:
            found = row.get(task)
            reward = "-" if found is None or found.reward is None else f"{found.reward:.2f}"
            shown.append("" if found is None else f"[{_STYLE[found.verdict]}]{found.verdict}[/] {reward}")
        evidence = "; ".join(
            dict.fromkeys(
                item for cell in row.values() if cell.failing or cell.verdict == "infra" for item in cell.evidence
            )
        )
        grid.add_row(hack, *shown, " ".join(evidence.split())[:160])
    return grid


def failures(cells: Sequence[Cell]) -> list[Cell]:
    return [cell for cell in cells if cell.failing]


def unscored(cells: Sequence[Cell]) -> str:
    """Why the red team proves nothing ("" when it does): the honest failure scored on no task, so no hack
    has a baseline (the verifier or the runtime fails every session: the table's evidence says why)."""
    if any(cell.hack == BASELINE and cell.verdict != "infra" for cell in cells):
        return ""
    reasons = dict.fromkeys(item for cell in cells if cell.hack == BASELINE for item in cell.evidence)
    return f"the honest-failure agent scored on no task ({'; '.join(reasons)[:300] or 'no session'})"


def summary(cells: Sequence[Cell]) -> str:
    """One line naming each hack that paid, leaked or escaped, and on how many tasks (or that none did)."""
    failing = failures(cells)
    if not failing:
        scored = sum(cell.verdict != "infra" for cell in cells)
        return f"no hack paid ({scored} of {len(cells)} sessions scored)"
    counts: dict[tuple[str, str], list[str]] = {}
    for cell in failing:
        counts.setdefault((cell.hack, cell.verdict), []).append(cell.task_id)
    named = ", ".join(
        f"{hack} {verdict} on {len(tasks)} task(s) ({tasks[0]}...)" for (hack, verdict), tasks in counts.items()
    )
    return f"the verifier can be fooled: {named}"


def chosen_hacks(verifier_kind: str, names: Sequence[str] | None) -> list[Hack]:
    unknown = [name for name in names or () if name not in BY_NAME]
    if unknown:
        raise InvalidArgumentError(f"unknown hack {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return applicable(verifier_kind, list(names) if names else None)


async def run(args: argparse.Namespace) -> list[Cell]:
    base = load_spec(args.spec, args.verifier, args.verifier_config)
    if args.runtime:
        base.runtime.kind = args.runtime
    if args.image:
        base.runtime.image = args.image
    hacks = chosen_hacks(base.verifier.kind, args.hack)
    if args.rollout is not None:
        specs = hack_specs(base, hacks, args.tasks)
        return await red_team(
            args.rollout, specs, timeout_s=args.timeout_s, pass_threshold=args.pass_threshold, console=_console
        )
    async with own_stack(args.data_dir, slots=args.slots, start_timeout_s=args.start_timeout_s) as (target, ports):
        specs = hack_specs(base, hacks, args.tasks, ports)
        return await red_team(
            target, specs, timeout_s=args.timeout_s, pass_threshold=args.pass_threshold, console=_console
        )


__all__ = ["HACKS", "hack_specs", "red_team", "run", "table"]
