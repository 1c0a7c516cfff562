"""`lodestar up --tls`: a local CA, one certificate per service and a control-plane token, created under
<data-dir>/tls on first use and reused afterwards; every service gets mutual TLS and the token, and `up`
itself (health checks) and the printed client settings use the `client` certificate. `lodestar train`
attaching to such a stack (its addresses file names the directory) uses the same `client` identity and
starts its trainer with the `trainer` one (`client`, `service_args`).

etcd is secured too (`etcd`): it serves the PKI's `etcd` certificate on https://, requires client
certificates from the same CA and has authentication enabled; rollout and the gateway, its only clients,
reach it with their own certificates (`--etcd-tls-*`), whose CNs are their etcd users."""

from __future__ import annotations

import secrets
from pathlib import Path

from lodestar.grpc.security import Security
from lodestar.local import LocalEtcdTls, ServiceSpec
from lodestar.tls import LocalPki, ensure_local_pki

ETCD_CLIENTS = ("rollout", "gateway")
"""The services that talk to etcd: each is an etcd user (its certificate's CN) allowed lodestar's keys."""


def _token(directory: Path) -> Path:
    path = directory / "token"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32) + "\n")
    return path


def service_args(tls_dir: Path, service: str) -> list[str]:
    """The TLS and token flags of `service` (its own certificate, the CA, the token file) in `tls_dir`."""
    pki = ensure_local_pki(tls_dir)
    identity = pki.identities[service]
    args = ["--tls-cert", str(identity.cert), "--tls-key", str(identity.key), "--tls-ca", str(pki.ca)]
    return [*args, "--auth-token-file", str(_token(tls_dir))]


def etcd(data_dir: Path) -> LocalEtcdTls:
    """TLS and authentication of the local etcd of a stack secured under `<data_dir>/tls`."""
    return LocalEtcdTls(ensure_local_pki(data_dir / "tls"), ETCD_CLIENTS)


def etcd_args(tls_dir: Path, service: str) -> list[str]:
    """The flags with which `service` reaches the local etcd: the CA, its own certificate and key."""
    pki = ensure_local_pki(tls_dir)
    identity = pki.identities[service]
    return ["--etcd-tls-ca", str(pki.ca), "--etcd-tls-cert", str(identity.cert), "--etcd-tls-key", str(identity.key)]


def client(tls_dir: Path) -> Security:
    """The `client` identity, the CA and the token of the stack secured under `tls_dir`."""
    pki = ensure_local_pki(tls_dir)
    identity = pki.identities["client"]
    return Security(identity.cert, identity.key, pki.ca, _token(tls_dir).read_text().strip())


def secure(specs: list[ServiceSpec], data_dir: Path) -> tuple[Security, LocalPki, Path]:
    """Add TLS and token flags to every spec (and etcd's to its clients); returns the client's Security, the
    PKI and the token file."""
    tls_dir = data_dir / "tls"
    pki = ensure_local_pki(tls_dir)
    for spec in specs:
        spec.args += service_args(tls_dir, spec.name)
        if spec.name in ETCD_CLIENTS:
            spec.args += etcd_args(tls_dir, spec.name)
    return client(tls_dir), pki, _token(tls_dir)
