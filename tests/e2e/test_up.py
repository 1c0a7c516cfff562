"""`lodestar up`: etcd + four services as real processes, SERVING, and a clean stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.up_support import ADDRESS, read_until, up_process

pytestmark = pytest.mark.slow


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_up_check_reports_every_service_serving(tmp_path: Path) -> None:
    process = up_process(tmp_path, "--check")
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output
    ports = dict((name, int(port)) for name, port in ADDRESS.findall(output))
    assert set(ports) == {"etcd", "inference", "rollout", "gateway", "trainer"}, output
    assert output.count("│ SERVING") == 4
    assert "self-check passed" in output
    # --check stops everything it started before exiting.
    assert not any(_listening(port) for port in ports.values())


def test_up_stops_everything_on_sigterm(tmp_path: Path) -> None:
    process = up_process(tmp_path)
    try:
        output = read_until(process, "Ctrl-C stops everything", timeout=240)
        ports = dict((name, int(port)) for name, port in ADDRESS.findall(output))
        assert len(ports) == 5, output
        assert all(_listening(port) for port in ports.values())
        # Health answers SERVING over gRPC for each service, via the CLI.
        for name in ("inference", "rollout", "gateway", "trainer"):
            check = subprocess.run(
                [sys.executable, "-m", "lodestar_app.cli.main", "health", f"127.0.0.1:{ports[name]}"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert check.returncode == 0, check.stdout + check.stderr
            assert "SERVING" in check.stdout
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert process.returncode == 0
        assert not any(_listening(port) for port in ports.values())
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_up_names_the_package_when_etcd_is_missing(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no etcd on PATH
    result = subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", "up", "--check", "--data-dir", str(tmp_path / "up")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode != 0
    assert "etcd-server" in result.stderr
