"""A deployment's control-plane credentials on disk: one token file per role (and per node), and the table
of their SHA-256 digests that every server checks (`lodestar.grpc.roles.TokenTable`).

`ensure_tokens(directory, names)` makes what is missing and keeps what exists (adding a node later keeps the
other tokens), so `lodestar auth tokens` and `lodestar up --tls` can run again safely:

    <directory>/operator.token       operator's token (the CLI: --auth-token-file)
    <directory>/trainer.token        the trainer's
    <directory>/node-<id>.token      gateway node <id>'s, bound to its node id
    <directory>/tokens.sha256        `role[:identity] sha256:<hex>` lines: every server's --auth-tokens-file

Token files are created 0600; the table (0644) holds no token, so it may be mounted where a token may not.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from lodestar.errors import InvalidArgumentError
from lodestar.grpc.roles import token_line

TABLE_NAME = "tokens.sha256"


def token_file_name(name: str) -> str:
    """`operator` -> operator.token, `node:gw-1` -> node-gw-1.token, `operator,trainer` -> operator+trainer.token."""
    role, _, identity = name.partition(":")
    stem = role.replace(",", "+") + (f"-{identity}" if identity else "")
    if not stem or "/" in stem or stem.startswith("."):
        raise InvalidArgumentError(f"not a role name: {name!r}")
    return f"{stem}.token"


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def ensure_tokens(directory: Path, names: list[str]) -> Path:
    """Make the token file of each of `names` ("operator", "trainer", "node:gw-1", ...) that is missing, and
    rewrite the digest table over every token file in `directory`; returns the table's path."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in names:
        path = directory / token_file_name(name)
        if not path.exists():
            _write(path, secrets.token_urlsafe(32) + "\n")
    lines = [token_line(_role_of(path), read_token(path), hashed=True) for path in sorted(directory.glob("*.token"))]
    table = directory / TABLE_NAME
    _write(table, "\n".join(lines) + "\n", 0o644)  # digests only: readable by any service's user
    return table


def _role_of(path: Path) -> str:
    """The role a token file was made for, from its name (the inverse of `token_file_name`)."""
    roles, _, identity = path.name.removesuffix(".token").partition("-")
    return roles.replace("+", ",") + (f":{identity}" if identity else "")


def read_token(path: Path) -> str:
    """The token of a token file (the file holds the token alone)."""
    try:
        token = path.read_text().strip()
    except OSError as error:
        raise InvalidArgumentError(f"cannot read token file {path}: {error.strerror}") from error
    if not token:
        raise InvalidArgumentError(f"token file {path} is empty")
    return token
