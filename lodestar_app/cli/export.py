"""`lodestar export RUN_ID --min-reward R --format {chat-jsonl,parquet}`: accepted trajectories as SFT data.

Reads the rollout store (`--store`: a SQLite file or a `postgresql://` URL; without it, the first of the
local stores that holds the run: `lodestar up`'s `.lodestar/up/rollout.sqlite`, then `lodestar train`'s
`.lodestar/train/rollout.sqlite`), keeps the scored sessions of the run whose reward is >= `--min-reward`,
and writes one record per chain end (`services/rollout/lodestar_rollout/export.py` says what a record holds). Prints a
summary table to stderr and the output path on stdout.

`lodestar export --checkpoint DIR --out OUT [--merged] [--base MODEL]`: the LoRA adapter of a trainer
checkpoint (`[trainer.lora]`), alone in peft's format or merged onto its base model as a plain Hugging Face
model directory (services/trainer/lodestar_trainer/lora.py `export_adapter`).
"""

from __future__ import annotations

import argparse
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lodestar.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from lodestar_app.cli.missing import register_missing

LOCAL_STORES = (Path(".lodestar/up/rollout.sqlite"), Path(".lodestar/train/rollout.sqlite"))
"""The stores `lodestar up` and `lodestar train` (default `data_dir`) write, relative to the working directory."""


def _holds_run(path: Path, run_id: str) -> bool:
    """Whether the SQLite rollout store at `path` has the run (read-only; False when it is no such store)."""
    try:
        with sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True) as db:
            return db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is not None
    except sqlite3.Error:
        return False


def find_store(run_id: str, candidates: Sequence[Path] = LOCAL_STORES) -> str:
    """The first of the local stores that holds `run_id` (NotFoundError naming those looked at)."""
    for path in candidates:
        if path.is_file() and _holds_run(path, run_id):
            return str(path)
    looked = ", ".join(str(path) for path in candidates)
    raise NotFoundError(f"run {run_id} is in none of {looked} (give --store)")


def _export_model(args: argparse.Namespace) -> int:
    """`--checkpoint`: the adapter alone, or merged onto its base model."""
    if args.out is None:
        raise InvalidArgumentError("--checkpoint needs --out DIR (where the adapter or the merged model goes)")
    try:
        from lodestar_trainer.lora import export_adapter
    except ModuleNotFoundError as missing:
        raise FailedPreconditionError(
            "exporting a checkpoint needs the trainer: pip install 'lodestar[trainer]'"
        ) from missing
    print(export_adapter(args.checkpoint, args.out, merged=args.merged, base=args.base))
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.checkpoint is not None:
        return _export_model(args)
    if args.run_id is None:
        raise InvalidArgumentError("give RUN_ID (trajectories as SFT data) or --checkpoint DIR (a LoRA adapter)")
    from lodestar_rollout import sft_files
    from lodestar_rollout.export import accepted_records
    from lodestar_rollout.stores import describe, is_postgres, open_store

    if args.store is None:
        args.store = find_store(args.run_id)
    elif not is_postgres(args.store) and not Path(args.store).is_file():
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
    help_text = "a run's accepted trajectories as SFT data (JSONL or Parquet)"
    try:
        from lodestar_rollout.sft_files import FORMATS
    except ModuleNotFoundError:  # an image without the rollout service
        register_missing(subparsers, "export", "rollout", help_text)
        return
    command = subparsers.add_parser("export", help=help_text)
    command.add_argument("run_id", metavar="RUN_ID", nargs="?", help="the run to export")
    command.add_argument("--min-reward", type=float, default=1.0, help="keep sessions with reward >= R (default 1)")
    command.add_argument("--format", choices=FORMATS, default="chat-jsonl", help="output format (default chat-jsonl)")
    command.add_argument("--out", type=Path, default=None, help="output file (default RUN_ID-sft.jsonl|.parquet)")
    command.add_argument(
        "--store",
        default=None,
        help="rollout store: SQLite file or postgresql:// URL (default: the first of "
        + ", ".join(str(path) for path in LOCAL_STORES)
        + " that holds the run)",
    )
    command.add_argument(
        "--checkpoint", type=Path, default=None, help="instead: a LoRA trainer checkpoint's adapter, to --out DIR"
    )
    command.add_argument("--merged", action="store_true", help="with --checkpoint: merged onto its base model")
    command.add_argument(
        "--base", type=Path, default=None, help="with --merged: the base model (default: the adapter's)"
    )
    command.set_defaults(handler=_export)
