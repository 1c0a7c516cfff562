"""Fixtures of the dashboard tests: one finished small run behind real dashboards, shared by the package."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.dashboard.stack import DashboardStack


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[DashboardStack]:
    started = DashboardStack(tmp_path_factory.mktemp("dashboard"), etcd_endpoint, f"/test/{uuid.uuid4().hex}/").start()
    try:
        yield started
    finally:
        started.stop()
