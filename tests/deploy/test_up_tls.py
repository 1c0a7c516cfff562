"""`lodestar up --tls`: a local CA, per-service certificates and a token are made on first use, every
service serves mutual TLS with the control-plane token, and the self-check passes over TLS."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from lodestar.tls import SERVICES, ensure_local_pki

pytestmark = pytest.mark.slow


def test_up_with_tls_makes_a_ca_and_serves_mutual_tls(tmp_path: Path) -> None:
    data = tmp_path / "up"
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "lodestar.cli.main", "up", "--data-dir", str(data), "--tls", "--check"]
    result = subprocess.run(
        [*command, "--backend", "scripted"], capture_output=True, text=True, env=env, timeout=240, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "self-check passed" in result.stderr + result.stdout
    tls = data / "tls"
    for name in SERVICES:
        assert (tls / f"{name}.pem").exists()
        assert stat.S_IMODE((tls / f"{name}-key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((tls / "token").stat().st_mode) == 0o600
    for service in ("inference", "rollout", "gateway", "trainer"):
        started = [
            json.loads(line)
            for line in (data / "logs" / f"{service}.log").read_text().splitlines()
            if '"grpc server started"' in line
        ]
        assert started, service
        assert started[-1]["tls"] is True
        assert started[-1]["mutual_tls"] is True
        assert started[-1]["control_plane_token"] is True


def test_the_local_pki_is_made_once_and_signed_by_its_ca(tmp_path: Path) -> None:
    first = ensure_local_pki(tmp_path)
    ca_bytes = first.ca.read_bytes()
    cert_bytes = first.identities["rollout"].cert.read_bytes()
    again = ensure_local_pki(tmp_path)
    assert again.ca.read_bytes() == ca_bytes
    assert again.identities["rollout"].cert.read_bytes() == cert_bytes
    ca = x509.load_pem_x509_certificate(ca_bytes)
    cert = x509.load_pem_x509_certificate(cert_bytes)
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "rollout", "rollout.lodestar.svc"} <= set(names.get_values_for_type(x509.DNSName))
