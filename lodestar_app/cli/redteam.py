"""`lodestar redteam SPEC|TASKS`: the command and its flags (what it does: redteam_run.py, imported on use, so
the CLI starts where the gateway's package is not installed, e.g. in the rollout image)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from rich.console import Console

from lodestar import kinds
from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar_app.cli import client_security


def _handle(args: argparse.Namespace) -> int:
    from lodestar_app.cli.redteam_run import failures, run, summary, table, unscored

    if args.tasks < 1:
        raise InvalidArgumentError("--tasks must be at least 1")
    cells = asyncio.run(run(args))
    if args.json:
        print(json.dumps([cell.__dict__ for cell in cells], indent=2))
    else:
        console = Console()
        console = console if console.is_terminal else Console(width=200)
        console.print(table(cells))
        console.print(summary(cells), highlight=False)
    if failures(cells):
        return 1
    if why := unscored(cells):
        raise FailedPreconditionError(f"the red team could not score: {why}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `redteam` command."""
    command = subparsers.add_parser(
        "redteam", help="attack a task set's verifier with known reward hacks (exit 1 when one pays)"
    )
    command.add_argument("spec", type=Path, metavar="SPEC|TASKS", help="run spec, tasks JSONL or task-set directory")
    command.add_argument("--tasks", type=int, default=2, help="tasks to attack, spread over the set (default 2)")
    command.add_argument(
        "--hack", action="append", default=None, metavar="NAME", help="only these hacks (repeat; docs/redteam.md)"
    )
    command.add_argument("--runtime", choices=kinds.RUNTIME_KINDS, default=None, help="runtime.kind of the runs")
    command.add_argument("--image", default="", help="runtime.image of the runs")
    command.add_argument(
        "--rollout",
        default=None,
        metavar="HOST:PORT",
        help="attack through this stack's node and model (default: a stack of its own with a scripted echo model)",
    )
    command.add_argument(
        "--verifier", default="exact_match", choices=kinds.VERIFIER_KINDS, help="verifier kind for a JSONL TASKS file"
    )
    command.add_argument("--verifier-config", default="", help="verifier config (JSON) for a JSONL TASKS file")
    command.add_argument("--pass-threshold", type=float, default=1.0, help="the noop agent pays at reward >= this")
    command.add_argument("--timeout-s", type=float, default=900.0, help="seconds to wait for the runs (default 900)")
    command.add_argument("--json", action="store_true", help="print the cells as JSON")
    command.add_argument("--data-dir", type=Path, default=Path(".lodestar/redteam"), help="own stack's state")
    command.add_argument("--slots", type=int, default=4, help="sessions the own stack's node runs at once")
    command.add_argument("--start-timeout-s", type=float, default=180.0, help="seconds each own service may take")
    client_security.add_arguments(command)
    command.set_defaults(handler=client_security.secured(_handle))
