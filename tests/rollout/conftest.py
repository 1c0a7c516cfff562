"""Fixtures of the rollout tests: an in-process rollout server on real etcd + a real SQLite store, and
the store location parametrized over SQLite and a real PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from lodestar.etcd import EtcdClient
from tests.rollout.helpers import Rollout, settings, start_rollout
from tests.rollout.postgres import PACKAGE_HINT, PostgresServer, find_bin_dir


@pytest.fixture
async def etcd(etcd_endpoint: str) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_endpoint) as client:
        yield client


@pytest.fixture
async def rollout(tmp_path: Path, etcd_endpoint: str, etcd_prefix: str) -> AsyncIterator[Rollout]:
    async with start_rollout(settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix)) as started:
        yield started


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL (apt package `postgresql`) for the whole session."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.fail(f"PostgreSQL not found: {PACKAGE_HINT}", pytrace=False)
    server = PostgresServer(bin_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives: a SQLite file, or a fresh database on the test PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "rollout.sqlite")
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database()
