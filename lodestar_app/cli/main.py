"""Entry point of the `lodestar` console script.

Each command group lives in its own module with a `register(subparsers)` function that adds its
sub-commands and sets `handler` on them; a handler takes the parsed namespace and returns an exit code.
Service modules are imported inside handlers so `lodestar --help` stays fast and light.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from lodestar import __version__
from lodestar.errors import LodestarError
from lodestar.logging import configure_logging
from lodestar_app.cli import (
    access,
    dashboard,
    export,
    health,
    images,
    model,
    plot,
    redteam,
    run,
    services,
    session,
    train,
    up,
)
from lodestar_app.cli import eval as eval_cmd

COMMAND_GROUPS = (
    services,
    up,
    health,
    model,
    session,
    run,
    plot,
    export,
    eval_cmd,
    redteam,
    train,
    images,
    dashboard,
    access,
)


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations, for every command (sub-commands' parsers are of this class too): a
    prefix of a flag is an error, so an old spelling such as `--timeout` never parses as `--timeout-s`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lodestar", description="lodestar: train unmodified coding agents with GRPO.")
    parser.add_argument("--version", action="version", version=f"lodestar {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging()  # stderr, whatever the command: stdout is for results (`eval --json`); `serve` redoes it
    try:
        code: int = args.handler(args)
    except LodestarError as error:
        print(f"lodestar: error: {error.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
