"""`lodestar up --tls`: a local CA, one certificate per service and a control-plane token, created under
<data-dir>/tls on first use and reused afterwards; every service gets mutual TLS and the token, and `up`
itself (health checks) and the printed client settings use the `client` certificate."""

from __future__ import annotations

import secrets
from pathlib import Path

from lodestar.grpc.security import Security
from lodestar.local import ServiceSpec
from lodestar.tls import LocalPki, ensure_local_pki


def _token(directory: Path) -> Path:
    path = directory / "token"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32) + "\n")
    return path


def secure(specs: list[ServiceSpec], data_dir: Path) -> tuple[Security, LocalPki, Path]:
    """Add TLS and token flags to every spec; returns the client's Security, the PKI and the token file."""
    pki = ensure_local_pki(data_dir / "tls")
    token_file = _token(data_dir / "tls")
    for spec in specs:
        identity = pki.identities[spec.name]
        spec.args += ["--tls-cert", str(identity.cert), "--tls-key", str(identity.key), "--tls-ca", str(pki.ca)]
        spec.args += ["--auth-token-file", str(token_file)]
    client = pki.identities["client"]
    return Security(client.cert, client.key, pki.ca, token_file.read_text().strip()), pki, token_file
