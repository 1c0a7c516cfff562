"""Settings of the rollout service (`lodestar rollout serve`)."""

from __future__ import annotations

from pathlib import Path

from lodestar.settings import ServiceSettings


class RolloutSettings(ServiceSettings):
    section = "rollout"

    port: int = 50053
    etcd: str = "http://127.0.0.1:2379"
    """etcd endpoint for node leases, session ownership and leader election."""
    etcd_prefix: str = "/lodestar/"
    """Root of lodestar's etcd keys: ownership under <prefix>rollout/owners/, the leader at <prefix>rollout/leader."""
    store: Path = Path(".lodestar/rollout.sqlite")
    """Durable store of runs, sessions, attempts and results (SQLite file). Instances sharing a store elect
    one leader; the others wait as standbys."""
    database: Path | None = None
    """Deprecated name of --store (used when --store is not given)."""
    leader_ttl_s: int = 5
    """TTL of the leader's etcd lease: a standby takes over about this long after the leader dies."""
    advertise: str | None = None
    """Address clients are redirected to while this instance leads (default: host:bound-port)."""
    store_synchronous: str = "normal"
    """SQLite synchronous mode: normal (a committed write survives a crash of the process) or full (also
    power loss, slower)."""

    @property
    def store_path(self) -> Path:
        default = type(self).model_fields["store"].default
        return self.database if self.database is not None and self.store == default else self.store


SETTINGS = RolloutSettings
