"""etcd outages shared by the gateway and rollout tests: start a stopped `EtcdServer` (the `private_etcd`
fixture of tests/conftest.py) again where it was."""

from __future__ import annotations

import subprocess
import time

from tests.conftest import EtcdServer, _healthy


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
