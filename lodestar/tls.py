"""A local certificate authority for development deployments (`lodestar up --tls`, `lodestar tls init`).

`ensure_local_pki(directory)` creates, on first use, a CA (`ca.pem`, `ca-key.pem`) and one certificate
per service and for etcd (`<name>.pem`, `<name>-key.pem`, CN `lodestar-<name>`) signed by it, valid for
both server and client use, with the names a local or containerised deployment dials (localhost,
127.0.0.1, ::1, the service name and its Kubernetes forms). Existing files are kept, so restarts reuse
the same identities. Keys are ECDSA P-256, written 0600. Production deployments bring their own CA
(cert-manager, a corporate PKI).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICES = ("inference", "gateway", "rollout", "trainer", "client", "etcd")
VALID_DAYS = 365
_NAMESPACE = "lodestar"


@dataclass(frozen=True)
class Identity:
    """One certificate and its key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class LocalPki:
    ca: Path
    identities: dict[str, Identity]


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{path} is not an ECDSA key")
    return key


def common_name(service: str) -> str:
    """The CN of `service`'s certificate: with etcd's --client-cert-auth, the etcd user it acts as."""
    return f"lodestar-{service}"


def _names(service: str) -> list[x509.GeneralName]:
    dns = ["localhost", service, f"{service}.{_NAMESPACE}", f"{service}.{_NAMESPACE}.svc"]
    dns.append(f"{service}.{_NAMESPACE}.svc.cluster.local")
    ips = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    return [*(x509.DNSName(name) for name in dns), *(x509.IPAddress(ip) for ip in ips)]


def _create_ca(cert_path: Path, key_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lodestar local CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS * 5))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def issue(ca_cert: Path, ca_key: Path, service: str, cert_path: Path, key_path: Path) -> None:
    """A certificate for `service` (server and client use) signed by the CA."""
    authority = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = _load_key(ca_key)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name(service))]))
        .issuer_name(authority.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(_names(service)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(signer, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def ensure_local_pki(directory: Path, services: tuple[str, ...] = SERVICES) -> LocalPki:
    """The CA and per-service certificates under `directory`, created where missing."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    if not (ca.exists() and ca_key.exists()):
        _create_ca(ca, ca_key)
    identities: dict[str, Identity] = {}
    for service in services:
        identity = Identity(directory / f"{service}.pem", directory / f"{service}-key.pem")
        if not (identity.cert.exists() and identity.key.exists()):
            issue(ca, ca_key, service, identity.cert, identity.key)
        identities[service] = identity
    return LocalPki(ca, identities)
