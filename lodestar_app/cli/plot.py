"""`lodestar plot RUN_DIR`: reward and throughput curves of a trainer run directory as PNG files."""

from __future__ import annotations

import argparse
from pathlib import Path


def _plot(args: argparse.Namespace) -> int:
    from lodestar_trainer.plot import plot_run  # matplotlib: only when plotting

    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `plot` command."""
    command = subparsers.add_parser("plot", help="reward and throughput curves of a trainer run as PNG")
    command.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the trainer's --run-dir (metrics.jsonl)")
    command.add_argument("--out", type=Path, default=None, help="directory for the PNG files (default RUN_DIR)")
    command.set_defaults(handler=_plot)
