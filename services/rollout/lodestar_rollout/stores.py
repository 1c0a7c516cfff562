"""Choosing the rollout store from `--store`: a `postgresql://` URL opens `PostgresStore`, anything
else is the path of a SQLite file."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from lodestar_rollout.store import SqliteStore, Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)


def open_store(location: str, *, synchronous: str = "normal") -> Store:
    """Open (and create the tables of) the store at `location`; blocking, run it off the event loop."""
    if is_postgres(location):
        from lodestar_rollout.pgstore import PostgresStore  # psycopg only where PostgreSQL is used

        return PostgresStore(location)
    return SqliteStore(Path(location), synchronous=synchronous)


def describe(location: str) -> str:
    """`location` for logs: a URL without its password."""
    if not is_postgres(location):
        return location
    parts = urlsplit(location)
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" if parts.username else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
