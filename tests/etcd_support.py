"""etcd for tests beyond the shared single member: start a stopped `EtcdServer` (the `private_etcd` fixture
of tests/conftest.py) again where it was (the gateway and rollout outage tests), and `EtcdCluster`, three
real members (the cluster and two-host tests)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lodestar.tls import Identity, LocalPki
from lodestar_app.local import find_etcd, free_port
from tests.conftest import EtcdServer, _healthy, _stop

CLUSTER_START_TIMEOUT_S = 30.0


def restart_etcd(server: EtcdServer) -> None:
    """Start the stopped etcd again: same ports, same data directory (the fixture stops it at the end)."""
    args = server.process.args
    assert isinstance(args, list)
    server.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not _healthy(server.endpoint):
        assert server.process.poll() is None, "restarted etcd exited"
        assert time.monotonic() < deadline, "restarted etcd not healthy within 15 s"
        time.sleep(0.05)


@dataclass(frozen=True)
class MemberTls:
    """Client TLS of a test cluster: each member serves `server` (valid for the cluster's address), requires
    client certificates signed by `ca` (--client-cert-auth), and is health-checked with `client`."""

    ca: Path
    server: Identity
    client: Identity

    def args(self) -> list[str]:
        files = [f"--cert-file={self.server.cert}", f"--key-file={self.server.key}", f"--trusted-ca-file={self.ca}"]
        return [*files, "--client-cert-auth"]

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(self.client.cert, self.client.key)
        return context


def certificate_for_address(pki: LocalPki, directory: Path, address: str) -> Identity:
    """A certificate and key signed by `pki`'s CA for a server at IP `address` (lodestar.tls issues its
    certificates for loopback and service names only; a test network's address needs its own)."""
    authority = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    signer = serialization.load_pem_private_key((pki.ca.parent / "ca-key.pem").read_bytes(), password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"etcd-{address}")]))
        .issuer_name(authority.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(signer, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    identity = Identity(directory / f"etcd-{address}.pem", directory / f"etcd-{address}-key.pem")
    identity.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    identity.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return identity


def _healthy_member(url: str, tls: MemberTls | None) -> bool:
    if tls is None:
        return _healthy(url)
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0, context=tls.ssl_context()) as reply:
            return bool(json.loads(reply.read()).get("health") == "true")
    except (OSError, urllib.error.URLError, ValueError):
        return False


class EtcdCluster:
    """Three etcd members on free ports of `host` (loopback by default), each with its own data dir; with
    `tls`, clients speak https and must present a certificate of its CA (members talk plaintext among
    themselves)."""

    def __init__(self, root: Path, size: int = 3, host: str = "127.0.0.1", tls: MemberTls | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        names = [f"m{i}" for i in range(size)]
        peers = {name: f"http://{host}:{free_port()}" for name in names}
        scheme = "http" if tls is None else "https"
        self.clients = {name: f"{scheme}://{host}:{free_port()}" for name in names}
        cluster = ",".join(f"{name}={url}" for name, url in peers.items())
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        for name in names:
            command = [find_etcd(), f"--name={name}", f"--data-dir={root / name}"]
            command += [f"--listen-client-urls={self.clients[name]}", f"--advertise-client-urls={self.clients[name]}"]
            command += [f"--listen-peer-urls={peers[name]}", f"--initial-advertise-peer-urls={peers[name]}"]
            command += [f"--initial-cluster={cluster}", "--initial-cluster-state=new", "--log-level=warn"]
            command += ["--logger=zap", "--heartbeat-interval=100", "--election-timeout=1000"]
            command += tls.args() if tls is not None else []
            with (root / f"{name}.log").open("ab") as log:
                self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
        while not all(_healthy_member(url, tls) for url in self.clients.values()):
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the etcd cluster did not become healthy; logs in {root}")
            time.sleep(0.1)

    def leader(self) -> str:
        """Name of the raft leader (from each member's status)."""
        for name, url in self.clients.items():
            if self.processes[name].poll() is not None:
                continue
            request = urllib.request.Request(f"{url}/v3/maintenance/status", data=b"{}", method="POST")
            with urllib.request.urlopen(request, timeout=5) as reply:
                status = json.loads(reply.read())
            if status["leader"] == status["header"]["member_id"]:
                return name
        raise AssertionError("no member is the raft leader")

    def endpoints(self, first: str) -> str:
        """Every client URL, comma-separated, `first` first."""
        return ",".join([self.clients[first], *(url for name, url in self.clients.items() if name != first)])

    def kill(self, name: str) -> None:
        self.processes[name].kill()
        self.processes[name].wait()

    def stop(self) -> None:
        for process in self.processes.values():
            _stop(process)
