"""`lodestar up --tls`: a local CA, one certificate per service and control-plane tokens per role, created
under <data-dir>/tls on first use and reused afterwards; every service gets mutual TLS, its role's token
and the table of every role's token digests (`lodestar.credentials`: the trainer `trainer`, the gateway node
`node:local`, the CLI `operator`; inference and rollout call nothing and only check tokens), and `up`
itself (health checks) and the printed client settings use the `client` certificate and the operator
token. `lodestar train` attaching to such a stack (its addresses file names the directory) uses the same
`client` identity and starts its trainer with the `trainer` one (`client`, `service_args`).

etcd is secured too (`etcd`): it serves the PKI's `etcd` certificate on https://, requires client
certificates from the same CA and has authentication enabled; rollout and the gateway, its only clients,
reach it with their own certificates (`--etcd-tls-*`), whose CNs are their etcd users."""

from __future__ import annotations

from pathlib import Path

from lodestar.credentials import ensure_tokens, read_token, token_file_name
from lodestar.grpc.security import Security
from lodestar.tls import LocalPki, ensure_local_pki
from lodestar_app.local import LocalEtcdTls, ServiceSpec

ETCD_CLIENTS = ("rollout", "gateway")
"""The services that talk to etcd: each is an etcd user (its certificate's CN) allowed lodestar's keys."""


NODE_ID = "local"
"""The gateway node's id in a secured local stack (its token is bound to it)."""
ROLE_OF = {"trainer": "trainer", "gateway": f"node:{NODE_ID}", "client": "operator"}
"""The role token each identity sends; inference and rollout send none."""


def _tokens(tls_dir: Path) -> Path:
    """The token files and the digest table under `<tls_dir>/tokens` (made once); returns the table."""
    return ensure_tokens(tls_dir / "tokens", sorted(set(ROLE_OF.values())))


def token_path(tls_dir: Path, identity: str = "client") -> Path:
    """The token file of `identity` ("client": the operator's)."""
    _tokens(tls_dir)
    return tls_dir / "tokens" / token_file_name(ROLE_OF[identity])


def service_args(tls_dir: Path, service: str) -> list[str]:
    """The TLS and token flags of `service` (its own certificate, the CA, its role's token file, the digest
    table its server checks callers against) in `tls_dir`."""
    pki = ensure_local_pki(tls_dir)
    identity = pki.identities[service]
    args = ["--tls-cert", str(identity.cert), "--tls-key", str(identity.key), "--tls-ca", str(pki.ca)]
    args += ["--auth-tokens-file", str(_tokens(tls_dir))]
    if service in ROLE_OF:
        args += ["--auth-token-file", str(token_path(tls_dir, service))]
    if service == "gateway":
        args += ["--node-id", NODE_ID]
    return args


def etcd(data_dir: Path) -> LocalEtcdTls:
    """TLS and authentication of the local etcd of a stack secured under `<data_dir>/tls`."""
    return LocalEtcdTls(ensure_local_pki(data_dir / "tls"), ETCD_CLIENTS)


def etcd_args(tls_dir: Path, service: str) -> list[str]:
    """The flags with which `service` reaches the local etcd: the CA, its own certificate and key."""
    pki = ensure_local_pki(tls_dir)
    identity = pki.identities[service]
    return ["--etcd-tls-ca", str(pki.ca), "--etcd-tls-cert", str(identity.cert), "--etcd-tls-key", str(identity.key)]


def client(tls_dir: Path) -> Security:
    """The `client` identity, the CA and the operator token of the stack secured under `tls_dir`."""
    pki = ensure_local_pki(tls_dir)
    identity = pki.identities["client"]
    return Security(identity.cert, identity.key, pki.ca, read_token(token_path(tls_dir)))


def secure(specs: list[ServiceSpec], data_dir: Path) -> tuple[Security, LocalPki, Path]:
    """Add TLS and token flags to every spec (and etcd's to its clients); returns the client's Security, the
    PKI and the operator's token file."""
    tls_dir = data_dir / "tls"
    pki = ensure_local_pki(tls_dir)
    for spec in specs:
        spec.args += service_args(tls_dir, spec.name)
        if spec.name in ETCD_CLIENTS:
            spec.args += etcd_args(tls_dir, spec.name)
    return client(tls_dir), pki, token_path(tls_dir)
