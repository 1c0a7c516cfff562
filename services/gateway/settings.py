"""Settings of a gateway node (`lodestar gateway serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lodestar.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    section = "gateway"

    port: int = 50052
    http_host: str = "127.0.0.1"
    """Interface of the vendor-API HTTP port."""
    http_port: int = 8080
    """Vendor-API HTTP port (Anthropic, OpenAI Chat/Responses, Google); 0 picks a free one."""
    inference: str = "127.0.0.1:50051"
    """InferenceService address (host:port)."""
    rollout: str | None = None
    """RolloutService address; without it the node only proxies sessions opened by OpenSession."""
    etcd: str | None = None
    """etcd endpoint (http://host:port) for node membership; without it the node is not registered."""
    etcd_prefix: str = "/lodestar/"
    """Root of lodestar's etcd keys; the node registers as <prefix>nodes/<node_id>."""
    etcd_lease_ttl_s: int = 10
    """TTL of the node's etcd lease: a node that dies or is cut off vanishes from etcd after it."""
    node_id: str | None = None
    """Stable node id; defaults to hostname-pid."""
    data_dir: Path = Path(".lodestar/gateway")
    """Where the capture database (SQLite, WAL) lives."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest accepted HTTP request body; larger ones get 413 in the dialect's shape."""
    request_timeout_s: float = 600.0
    """Longest one model call may take end to end."""
    capture_synchronous: Literal["full", "normal", "off"] = "normal"
    """SQLite synchronous mode of the capture store: normal = a record committed before its response
    survives any crash of the gateway process; full = each commit is also fsynced (survives an OS crash or
    power loss, ~5 ms more per call)."""


SETTINGS = GatewaySettings
