"""`lodestar run {create,status,cancel,delete,archive} --rollout HOST:PORT`: runs on a RolloutService.

`create SPEC` reads a run spec (YAML or JSON; a string `tasks` names a JSONL file next to it), checks
it, sends it with the tasks inline and prints the run id alone on stdout. `status RUN_ID` shows a live
view (sessions by state, groups, reward mean, mean seconds per stage) refreshed until the run ends or
Ctrl-C; `--once` renders it once, `--json` prints the `Run` as JSON. `cancel RUN_ID` cancels the run.
`delete RUN_ID` deletes a finished run's data from the store; `archive RUN_ID` first writes its scored
trajectories to RUN_ID.parquet in the leader's archive folder (`--archive-dir`) and prints that path. Both
refuse a running run (cancel it first). Calls follow a standby's redirect to the leader.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import grpc.aio
from google.protobuf import json_format
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from lodestar.grpc.client import LeaderChannel
from lodestar.grpc.errors import error_from_rpc
from lodestar.v1 import rollout_pb2, rollout_pb2_grpc
from lodestar_app.cli import client_security

DEFAULT_ROLLOUT = "127.0.0.1:50053"
T = TypeVar("T")
_STAGES = ("init", "ready", "run", "post", "session")


async def _call(target: str, rpc: Callable[[rollout_pb2_grpc.RolloutServiceAsyncStub], Awaitable[T]]) -> T:
    channel = LeaderChannel(target)
    try:
        return await channel.call(lambda ch: rpc(rollout_pb2_grpc.RolloutServiceStub(ch)))
    except grpc.aio.AioRpcError as error:
        raise error_from_rpc(error) from None
    finally:
        await channel.close()


def render(run: rollout_pb2.Run) -> Group:
    """The status view of a run (a rich renderable)."""
    state = rollout_pb2.RunState.Name(run.state).removeprefix("RUN_STATE_").lower()
    sessions = Table(title=f"run {run.run_id} ({run.spec.name or 'unnamed'}): {state}", show_edge=False)
    for column in (
        "total",
        "pending",
        "ready",
        "running",
        "scored",
        "timed out",
        "infra-failed",
        "failed",
        "cancelled",
    ):
        sessions.add_column(column, justify="right")
    sessions.add_row(
        *(
            str(v)
            for v in (
                run.sessions_total,
                run.sessions_pending,
                run.sessions_ready,
                run.sessions_running,
                run.sessions_succeeded,
                run.sessions_timed_out,
                run.infra_failures,
                run.sessions_failed,
                run.sessions_cancelled,
            )
        )
    )
    summary = Table(show_header=True, show_edge=False)
    for column in (
        "groups complete",
        "groups delivered",
        "groups dropped",
        "reward mean",
        "policy",
        *(f"{s} s" for s in _STAGES),
    ):
        summary.add_column(column, justify="right")
    stage_means = [f"{run.stage_seconds_mean[s]:.2f}" if s in run.stage_seconds_mean else "-" for s in _STAGES]
    summary.add_row(
        f"{run.groups_complete}/{len(run.spec.tasks)}",
        str(run.groups_delivered),
        str(run.groups_dropped),
        f"{run.reward_mean:.3f}",
        str(run.policy_version),
        *stage_means,
    )
    return Group(sessions, summary)


async def _get(target: str, run_id: str) -> rollout_pb2.Run:
    reply = await _call(target, lambda stub: stub.GetRun(rollout_pb2.GetRunRequest(run_id=run_id)))
    return reply.run


def _create(args: argparse.Namespace) -> int:
    from lodestar_rollout.spec import load_spec_file

    spec = load_spec_file(args.spec)
    reply = asyncio.run(_call(args.rollout, lambda stub: stub.CreateRun(rollout_pb2.CreateRunRequest(spec=spec))))
    print(reply.run.run_id)
    return 0


async def _watch(args: argparse.Namespace, console: Console) -> None:
    run = await _get(args.rollout, args.run_id)
    with Live(render(run), console=console, refresh_per_second=4) as live:
        while run.state == rollout_pb2.RUN_STATE_RUNNING:
            await asyncio.sleep(args.interval_s)
            run = await _get(args.rollout, args.run_id)
            live.update(render(run))


def _status(args: argparse.Namespace) -> int:
    console = Console()
    if args.json:
        run = asyncio.run(_get(args.rollout, args.run_id))
        print(json.dumps(json_format.MessageToDict(run), indent=2))
    elif args.once:
        console.print(render(asyncio.run(_get(args.rollout, args.run_id))))
    else:
        asyncio.run(_watch(args, console))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    request = rollout_pb2.CancelRunRequest(run_id=args.run_id)
    reply = asyncio.run(_call(args.rollout, lambda stub: stub.CancelRun(request)))
    print(f"run {reply.run.run_id} cancelled ({reply.run.sessions_cancelled} sessions cancelled)")
    return 0


def _delete(args: argparse.Namespace) -> int:
    request = rollout_pb2.DeleteRunRequest(run_id=args.run_id)
    reply = asyncio.run(_call(args.rollout, lambda stub: stub.DeleteRun(request)))
    print(f"run {reply.run_id} deleted")
    return 0


def _archive(args: argparse.Namespace) -> int:
    request = rollout_pb2.ArchiveRunRequest(run_id=args.run_id)
    reply = asyncio.run(_call(args.rollout, lambda stub: stub.ArchiveRun(request)))
    print(f"run {reply.run_id} archived ({reply.sessions} scored sessions, {reply.records} records) and deleted")
    print(reply.path)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `run` command group."""
    group = subparsers.add_parser("run", help="create, watch or cancel runs on the rollout service")
    commands = group.add_subparsers(dest="run_command", required=True, metavar="COMMAND")
    creator = commands.add_parser("create", help="create a run from a spec file and print its id")
    creator.add_argument("spec", type=Path, help="run spec (YAML or JSON; see docs/runs.md)")
    creator.set_defaults(handler=client_security.secured(_create))
    status = commands.add_parser("status", help="show a run's progress (live until it ends)")
    status.add_argument("run_id", metavar="RUN_ID", help="the run to show")
    status.add_argument("--once", action="store_true", help="render once and exit")
    status.add_argument("--json", action="store_true", help="print the Run as JSON")
    status.add_argument("--interval-s", type=float, default=1.0, help="seconds between refreshes (default 1)")
    status.set_defaults(handler=client_security.secured(_status))
    canceller = commands.add_parser("cancel", help="cancel a run (its complete groups stay deliverable)")
    canceller.add_argument("run_id", metavar="RUN_ID", help="the run to cancel")
    canceller.set_defaults(handler=client_security.secured(_cancel))
    deleter = commands.add_parser("delete", help="delete a finished run and all its data")
    deleter.add_argument("run_id", metavar="RUN_ID", help="the run to delete")
    deleter.set_defaults(handler=client_security.secured(_delete))
    archiver = commands.add_parser("archive", help="write a finished run's trajectories to Parquet, then delete it")
    archiver.add_argument("run_id", metavar="RUN_ID", help="the run to archive")
    archiver.set_defaults(handler=client_security.secured(_archive))
    for command in (creator, status, canceller, deleter, archiver):
        command.add_argument("--rollout", default=DEFAULT_ROLLOUT, metavar="HOST:PORT", help="RolloutService address")
        client_security.add_arguments(command)
