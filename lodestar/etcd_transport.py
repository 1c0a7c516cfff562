"""How lodestar reaches etcd: endpoints, TLS and the secure default of a service's etcd client.

No etcd client here (`lodestar.etcd` is the wrapper that uses these): parsing "http://a:2379,https://..."
endpoints into one gRPC target, the TLS of `https://` endpoints (`EtcdTls`: the CA of etcd's certificate,
this client's certificate and key for etcd's `--client-cert-auth`), and `tls_from_settings`, which refuses
plaintext to an etcd beyond loopback unless a service's settings say `etcd_allow_insecure`
(docs/security.md, "etcd").
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import grpc

from lodestar import errors
from lodestar.grpc.security import Security, is_loopback
from lodestar.logging import get_logger
from lodestar.settings import EtcdClientSettings

_log = get_logger("etcd")


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd (`https://` endpoints): `ca` verifies etcd's server certificate (None: the system's
    roots); `cert` and `key` are this client's certificate (mutual TLS; with etcd's `--client-cert-auth`
    and auth enabled, its CN is the etcd user this client acts as)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise errors.InvalidArgumentError("the etcd client certificate and key go together (etcd_tls_cert/key)")

    def credentials(self) -> grpc.ChannelCredentials:
        if self.ca is None and self.cert is None:
            return grpc.ssl_channel_credentials()
        credentials = Security(tls_cert=self.cert, tls_key=self.key, tls_ca=self.ca).channel_credentials()
        assert credentials is not None  # a CA or a certificate: TLS
        return credentials


@dataclass(frozen=True)
class Endpoint:
    """One etcd endpoint: "http" or "https", host, port."""

    scheme: str
    host: str
    port: int


def parse_endpoint(endpoint: str) -> Endpoint:
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise errors.InvalidArgumentError(
            f"etcd endpoint must look like http://host:port or https://host:port, got {endpoint!r}"
        )
    return Endpoint(parts.scheme, parts.hostname, parts.port)


def endpoints_of(endpoints: str) -> list[Endpoint]:
    """The comma-separated endpoints, all of one scheme."""
    parsed = [parse_endpoint(item.strip()) for item in endpoints.split(",") if item.strip()]
    if not parsed:
        raise errors.InvalidArgumentError("no etcd endpoint given")
    if len({item.scheme for item in parsed}) > 1:
        raise errors.InvalidArgumentError(f"etcd endpoints mix http:// and https://: {endpoints!r}")
    return parsed


def channel_address(addresses: list[Endpoint]) -> tuple[str, int]:
    """The (host, port) that aetcd joins into its gRPC target "host:port".

    One endpoint is used as is (a DNS name resolving to every member, such as a Kubernetes headless
    service, already fails over). Several comma-separated endpoints (a cluster's members) become one
    gRPC target over all their addresses, "ipv4:A:1,B:2,C:3" (names are resolved once, here): the channel
    connects to the first member that answers and moves to another when that one goes away.
    """
    if len(addresses) == 1:
        return addresses[0].host, addresses[0].port
    resolved = []
    for address in addresses:
        try:
            infos = socket.getaddrinfo(address.host, address.port, socket.AF_INET, socket.SOCK_STREAM)
        except OSError as error:
            raise errors.UnavailableError(f"cannot resolve etcd endpoint {address.host}: {error}") from error
        resolved.append(f"{infos[0][4][0]}:{address.port}")
    *first, last = resolved
    last_host, last_port = last.rsplit(":", 1)  # aetcd appends ":port" to the host
    return "ipv4:" + ",".join([*first, last_host]), int(last_port)


def tls_from_settings(endpoint: str, settings: EtcdClientSettings) -> EtcdTls | None:
    """The TLS of the etcd client a service builds from its settings (None: plaintext `http://`).

    The secure default (docs/security.md): a plaintext `http://` endpoint beyond loopback is refused
    (FailedPreconditionError, before the service starts) unless `etcd_allow_insecure`, and then logged
    loudly: whoever reaches it could read every key and write node, ownership and leader keys. TLS files
    with an `http://` endpoint are refused too (they would be silently unused).
    """
    addresses = endpoints_of(endpoint)
    given = (settings.etcd_tls_ca, settings.etcd_tls_cert, settings.etcd_tls_key)
    if addresses[0].scheme == "https":
        tls = EtcdTls(*given)
        tls.credentials()  # an unreadable file fails the start, not each reconnect
        return tls
    if any(item is not None for item in given):
        raise errors.InvalidArgumentError(
            f"etcd TLS files are given but the etcd endpoint {endpoint} is http://: use https://host:port"
        )
    exposed = [item.host for item in addresses if not is_loopback(item.host)]
    if exposed and not settings.etcd_allow_insecure:
        raise errors.FailedPreconditionError(
            f"refusing plaintext etcd at {endpoint} (beyond loopback) without TLS: use https:// with "
            "--etcd-tls-ca, --etcd-tls-cert and --etcd-tls-key (etcd with --client-cert-auth), or pass "
            "--etcd-allow-insecure to send etcd traffic in the clear and unauthenticated"
        )
    if exposed:
        _log.warning("etcd beyond loopback WITHOUT TLS or authentication (--etcd-allow-insecure)", endpoint=endpoint)
    return None
