"""`lodestar up --tls`: a local CA, per-service certificates and tokens per role are made on first use, every
service serves mutual TLS and checks the roles' tokens, etcd runs with TLS, client certificates and auth
(rollout and the gateway reach it with theirs), the self-check passes over TLS, and `lodestar train`
attaches to such a stack with its client identity, or to any secured stack with its own TLS and token flags."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import grpc.aio
import pytest
from cryptography import x509
from rich.console import Console

from lodestar.errors import UnauthenticatedError, UnavailableError
from lodestar.grpc import security
from lodestar.tls import SERVICES, ensure_local_pki
from lodestar.v1 import rollout_pb2
from lodestar_app.cli import client_security, train_stack, up_tls
from lodestar_app.cli.main import build_parser
from lodestar_app.cli.run import _call
from lodestar_app.cli.train_config import TrainConfig
from tests.rollout.helpers import make_spec

pytestmark = pytest.mark.slow


def test_up_with_tls_makes_a_ca_and_serves_mutual_tls(tmp_path: Path) -> None:
    data = tmp_path / "up"
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "lodestar_app.cli.main", "up", "--data-dir", str(data), "--tls", "--check"]
    result = subprocess.run(
        [*command, "--backend", "scripted"], capture_output=True, text=True, env=env, timeout=240, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "self-check passed" in result.stderr + result.stdout
    tls = data / "tls"
    for name in SERVICES:
        assert (tls / f"{name}.pem").exists()
        assert stat.S_IMODE((tls / f"{name}-key.pem").stat().st_mode) == 0o600
    for token in ("operator", "trainer", "node-local"):  # one token per role; the servers check their digests
        assert stat.S_IMODE((tls / "tokens" / f"{token}.token").stat().st_mode) == 0o600
    assert "sha256:" in (tls / "tokens" / "tokens.sha256").read_text()
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
        assert started[-1]["token_roles"] is True
    # etcd: TLS, client certificates and auth on; rollout led and the gateway registered through it, each
    # as the etcd user its certificate names.
    etcd_log = (data / "logs" / "etcd.log").read_text()
    assert "client-cert-auth = true" in etcd_log
    assert "Authentication enabled" in etcd_log
    assert '"leading"' in (data / "logs" / "rollout.log").read_text()
    assert '"node registered in etcd"' in (data / "logs" / "gateway.log").read_text()


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


async def test_lodestar_train_attaches_to_an_up_tls_stack_with_its_client_identity(tmp_path: Path) -> None:
    """`lodestar up --tls` records its TLS directory in addresses.json; `lodestar train` attaching to it
    becomes a client with the `client` certificate and the token (CreateRun, GetRun answer), and the trainer
    it starts gets the `trainer` identity. Without them the same calls are refused."""
    data = tmp_path / "up"
    command = [sys.executable, "-m", "lodestar_app.cli.main", "up", "--data-dir", str(data), "--tls"]
    log = (tmp_path / "up.log").open("wb")
    process = await asyncio.create_subprocess_exec(*command, "--backend", "scripted", stdout=log, stderr=log)
    before = security.current()
    try:
        async with asyncio.timeout(180):
            while not (data / "addresses.json").exists():
                assert process.returncode is None, (tmp_path / "up.log").read_text()[-3000:]
                await asyncio.sleep(0.5)
        addresses = json.loads((data / "addresses.json").read_text())
        assert addresses["tls"] == str(data / "tls")
        with pytest.raises((UnauthenticatedError, UnavailableError, grpc.aio.AioRpcError)):  # no identity, no token
            await _call(addresses["rollout"], lambda s: s.GetRun(rollout_pb2.GetRunRequest(run_id="x"), timeout=5))

        stack = await train_stack._attach(data / "addresses.json")
        assert stack is not None
        assert stack.tls_dir == data / "tls"
        assert security.current().token == up_tls.token_path(data / "tls").read_text().strip()  # the operator's
        spec = make_spec(tasks=1, group_size=1)
        created = await _call(stack.rollout, lambda s: s.CreateRun(rollout_pb2.CreateRunRequest(spec=spec), timeout=30))
        request = rollout_pb2.GetRunRequest(run_id=created.run.run_id)
        assert (await _call(stack.rollout, lambda s: s.GetRun(request, timeout=10))).run.run_id == created.run.run_id
        trainer_args = up_tls.service_args(data / "tls", "trainer")
        assert str(data / "tls" / "trainer.pem") in trainer_args
        assert trainer_args[trainer_args.index("--auth-token-file") + 1].endswith("trainer.token")

        # Any other secured stack (an addresses file without `tls`): `lodestar train --tls-* --auth-token-file`.
        security.configure(before)
        other = tmp_path / "addresses.json"
        other.write_text(json.dumps({key: value for key, value in addresses.items() if key != "tls"}))
        pki = ensure_local_pki(data / "tls")
        client = pki.identities["client"]
        flags = ["--tls-cert", str(client.cert), "--tls-key", str(client.key), "--tls-ca", str(pki.ca)]
        flags += ["--auth-token-file", str(up_tls.token_path(data / "tls"))]
        args = build_parser().parse_args(["train", "t.toml", "--attach", str(other), *flags])
        client_security.configure(args)
        config = TrainConfig(tmp_path / "t.toml", tmp_path / "run.yaml", 1, tmp_path / "runs", attach=str(other))
        attached = await train_stack.open_stack(config, Console(), client_security.given(args))
        assert attached.tls_dir is None
        assert attached.client == flags  # what the trainer it starts gets
        assert (await _call(attached.rollout, lambda s: s.GetRun(request, timeout=10))).run.run_id == created.run.run_id
    finally:
        security.configure(before)
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(60):
            await process.wait()
        log.close()
