"""Fixtures of the rollout tests: an in-process rollout server on real etcd + a real SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lodestar.etcd import EtcdClient
from tests.rollout.helpers import Rollout, settings, start_rollout


@pytest.fixture
async def etcd(etcd_endpoint: str) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_endpoint) as client:
        yield client


@pytest.fixture
async def rollout(tmp_path: Path, etcd_endpoint: str, etcd_prefix: str) -> AsyncIterator[Rollout]:
    async with start_rollout(settings(tmp_path / "rollout.sqlite", etcd_endpoint, etcd_prefix)) as started:
        yield started
