"""`lodestar export RUN_ID --min-reward R --format {chat-jsonl,parquet}`: accepted trajectories as SFT data.

Reads the rollout store (`--store`: the SQLite file, default `lodestar up`'s, or a `postgresql://` URL),
keeps the scored sessions of the run whose reward is >= `--min-reward`, and writes one record per chain
end (`services/rollout/export.py` says what a record holds). Prints a summary table to stderr and the
output path on stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

DEFAULT_STORE = ".lodestar/up/rollout.sqlite"


def _export(args: argparse.Namespace) -> int:
    from services.rollout import sft_files
    from services.rollout.export import accepted_records
    from services.rollout.stores import describe, is_postgres, open_store

    if not is_postgres(args.store) and not Path(args.store).is_file():
        from lodestar.errors import NotFoundError

        raise NotFoundError(f"no rollout store at {args.store} (give --store)")
    store = open_store(args.store)
    try:
        records, stats = accepted_records(store, args.run_id, args.min_reward)
    finally:
        store.close()
    suffix = ".parquet" if args.format == "parquet" else ".jsonl"
    out: Path = args.out or Path(f"{args.run_id}-sft{suffix}")
    sft_files.write(records, out, args.format)
    table = Table(title=f"export of run {args.run_id} ({describe(args.store)})")
    for column in ("scored sessions", f"reward >= {args.min_reward:g}", "records", "tokens", "format", "file"):
        table.add_column(column)
    tokens = sum(len(r["token_ids"]) for r in records)
    table.add_row(str(stats.sessions), str(stats.accepted), str(stats.records), str(tokens), args.format, str(out))
    Console(stderr=True).print(table)
    print(out)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `export` command."""
    from services.rollout.sft_files import FORMATS

    command = subparsers.add_parser("export", help="a run's accepted trajectories as SFT data (JSONL or Parquet)")
    command.add_argument("run_id", metavar="RUN_ID")
    command.add_argument("--min-reward", type=float, default=1.0, help="keep sessions with reward >= R (default 1)")
    command.add_argument("--format", choices=FORMATS, default="chat-jsonl")
    command.add_argument("--out", type=Path, default=None, help="output file (default RUN_ID-sft.jsonl|.parquet)")
    command.add_argument(
        "--store", default=DEFAULT_STORE, help=f"rollout store: SQLite file or postgresql:// URL ({DEFAULT_STORE})"
    )
    command.set_defaults(handler=_export)
