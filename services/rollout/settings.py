"""Settings of the rollout service (`lodestar rollout serve`)."""

from __future__ import annotations

from pathlib import Path

from lodestar.settings import ServiceSettings


class RolloutSettings(ServiceSettings):
    section = "rollout"

    port: int = 50053
    etcd: str = "http://127.0.0.1:2379"
    """etcd endpoint for node leases, session ownership and leader election."""
    database: Path = Path(".lodestar/rollout.sqlite")
    """Durable store of runs, sessions, attempts and results (SQLite file)."""


SETTINGS = RolloutSettings
