"""This replica in etcd while it serves (`--etcd`): gateways and the trainer discover it there.

The record (`lodestar.inference_registry.ReplicaRecord`) names the address others dial (`--advertise-address`,
default `--host:port`, or hostname:port behind a wildcard host), the replica id and the policy version
served; it is rewritten after every published version. Registration starts once the engine serves (a
replica that is still loading is not discoverable) and ends when the drain begins, before in-flight calls
finish: gateways stop placing sessions on a draining replica at once instead of a TTL later.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime

from lodestar.etcd import tls_from_settings
from lodestar.inference_registry import ReplicaRecord, ReplicaRegistration
from lodestar_inference.service import InferenceService
from lodestar_inference.settings import InferenceSettings

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def advertised_address(settings: InferenceSettings, port: int) -> str:
    """Where other services dial this replica (see the module docstring)."""
    if settings.advertise_address:
        return settings.advertise_address
    host = socket.gethostname() if settings.host in WILDCARD_HOSTS else settings.host
    return f"{host}:{port}"


def registration(settings: InferenceSettings, service: InferenceService, port: int) -> ReplicaRegistration | None:
    """The etcd registration of a started service (None without `--etcd`); it follows published versions."""
    if not settings.etcd:
        return None
    record = ReplicaRecord(
        replica_id=service.replica_id,
        address=advertised_address(settings, port),
        policy_version=service.policy_version,
        model_name=service.model_name,
        started_at=datetime.now(UTC),
    )
    keeper = ReplicaRegistration(
        settings.etcd,
        record,
        ttl=settings.etcd_lease_ttl_s,
        prefix=settings.etcd_prefix,
        tls=tls_from_settings(settings.etcd, settings),
    )
    service.on_published.append(keeper.publish)
    return keeper
