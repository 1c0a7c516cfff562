"""TLS and token flags of every command that calls a service (`lodestar run ...`, `health`, `session`, `eval`,
`dashboard`, `train`): the same files a service takes, for a CLI talking to a secured deployment.
`LODESTAR_AUTH_TOKEN` supplies the token when no flag does (keeps it out of the process list)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from lodestar.grpc import security

TOKEN_ENV = "LODESTAR_AUTH_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-ca", type=Path, default=None, help="CA of the deployment (TLS)")
    parser.add_argument("--tls-cert", type=Path, default=None, help="client certificate (mutual TLS)")
    parser.add_argument("--tls-key", type=Path, default=None, help="key of --tls-cert")
    parser.add_argument(
        "--auth-token-file", type=Path, default=None, help=f"control-plane token file (or ${TOKEN_ENV})"
    )


def given(args: argparse.Namespace) -> list[str]:
    """The flags as given (paths made absolute), for a service process this command starts with the same
    identity; the token in `LODESTAR_AUTH_TOKEN` is not passed on (only a file keeps it off command lines)."""
    flags = {"--tls-cert": args.tls_cert, "--tls-key": args.tls_key, "--tls-ca": args.tls_ca}
    flags["--auth-token-file"] = args.auth_token_file
    return [item for flag, path in flags.items() if path is not None for item in (flag, str(path.resolve()))]


def configure(args: argparse.Namespace) -> None:
    """Install the process's client security from the parsed flags."""
    token = args.auth_token_file.read_text().strip() if args.auth_token_file is not None else None
    token = token or os.environ.get(TOKEN_ENV) or None
    security.configure(security.Security(args.tls_cert, args.tls_key, args.tls_ca, token))


def secured(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`handler`, configuring client security from its flags first."""

    def run(args: argparse.Namespace) -> int:
        configure(args)
        return handler(args)

    return run
