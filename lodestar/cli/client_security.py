"""TLS and token flags of client commands (`lodestar run ...`, `lodestar health`): the same files a service
takes, for a CLI talking to a secured deployment. `LODESTAR_AUTH_TOKEN` supplies the token when no flag
does (keeps it out of the process list)."""

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
