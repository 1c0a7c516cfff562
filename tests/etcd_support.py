"""etcd for tests beyond the shared single member: start a stopped `EtcdServer` (the `private_etcd` fixture
of tests/conftest.py) again where it was (the gateway and rollout outage tests), and `EtcdCluster`, three
real members (the cluster and two-host tests)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from lodestar.local import find_etcd, free_port
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


class EtcdCluster:
    """Three etcd members on free ports of `host` (loopback by default), each with its own data dir."""

    def __init__(self, root: Path, size: int = 3, host: str = "127.0.0.1") -> None:
        root.mkdir(parents=True, exist_ok=True)
        names = [f"m{i}" for i in range(size)]
        peers = {name: f"http://{host}:{free_port()}" for name in names}
        self.clients = {name: f"http://{host}:{free_port()}" for name in names}
        cluster = ",".join(f"{name}={url}" for name, url in peers.items())
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        for name in names:
            command = [find_etcd(), f"--name={name}", f"--data-dir={root / name}"]
            command += [f"--listen-client-urls={self.clients[name]}", f"--advertise-client-urls={self.clients[name]}"]
            command += [f"--listen-peer-urls={peers[name]}", f"--initial-advertise-peer-urls={peers[name]}"]
            command += [f"--initial-cluster={cluster}", "--initial-cluster-state=new", "--log-level=warn"]
            command += ["--logger=zap", "--heartbeat-interval=100", "--election-timeout=1000"]
            with (root / f"{name}.log").open("ab") as log:
                self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
        while not all(_healthy(url) for url in self.clients.values()):
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
