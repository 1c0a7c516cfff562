"""Commands whose service is not installed in this environment (each image installs one service: docs/
architecture.md "Packages"): they stay in `lodestar --help` and say, whatever their arguments, how to install
what they need."""

from __future__ import annotations

import argparse
from functools import partial

from lodestar.errors import FailedPreconditionError


def register_missing(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, service: str, help_text: str
) -> None:
    """Add command `name`, which needs `service`'s package, as one that refuses with the install command."""
    # Any arguments at all (no option prefix), so the error names the install, not an unknown flag.
    command = subparsers.add_parser(name, help=f"{help_text} (not installed here)", prefix_chars="\0", add_help=False)
    command.add_argument("ignored", nargs="*", help=argparse.SUPPRESS)
    command.set_defaults(handler=partial(_refuse, service))


def _refuse(service: str, args: argparse.Namespace) -> int:
    raise FailedPreconditionError(
        f"the {service} service is not installed in this environment (lodestar_{service} is missing): "
        f"pip install 'lodestar[{service}]'"
    )
