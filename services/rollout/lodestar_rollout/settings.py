"""Settings of the rollout service (`lodestar rollout serve`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from lodestar.settings import EtcdClientSettings


class RolloutSettings(EtcdClientSettings):
    section = "rollout"

    port: int = 50053
    etcd: str = "http://127.0.0.1:2379"
    """etcd endpoint for node leases, session ownership and leader election: https://host:port (TLS,
    --etcd-tls-*), or http://host:port on loopback (beyond it only with --etcd-allow-insecure)."""
    etcd_prefix: str = "/lodestar/"
    """Root of lodestar's etcd keys: ownership under <prefix>rollout/owners/, the leader at <prefix>rollout/leader."""
    store: str = ".lodestar/rollout.sqlite"
    """Durable store of runs, sessions, attempts and results: a SQLite file path, or a PostgreSQL URL
    (postgresql://user:password@host:5432/db) when instances on different hosts share it. Instances
    sharing a store elect one leader; the others wait as standbys."""
    leader_ttl_s: int = 5
    """TTL of the leader's etcd lease: a standby takes over about this long after the leader dies."""
    advertise: str | None = None
    """Address clients are redirected to while this instance leads (default: host:bound-port)."""
    max_receive_message_bytes: int = Field(default=128 * 1024 * 1024, ge=64 * 1024)
    """Largest request message: CompleteSession carries a session's every call (tens of MB for hundreds of
    calls with 100 KB requests, their token ids and logprobs) and CreateRun a run's tasks inline."""
    store_synchronous: str = "normal"
    """SQLite synchronous mode: normal (a committed write survives a crash of the process) or full (also
    power loss, slower)."""
    retention_days: float = Field(default=0.0, ge=0.0)
    """Finished runs (completed or cancelled) are deleted with all their data this many days after they
    finished (0: kept until `lodestar run delete` or `lodestar run archive`)."""
    archive_dir: Path = Path(".lodestar/archive")
    """Where `lodestar run archive` writes RUN_ID.parquet, on the leader's host."""

    @field_validator("store", mode="before")
    @classmethod
    def _path_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, Path) else value


SETTINGS = RolloutSettings
