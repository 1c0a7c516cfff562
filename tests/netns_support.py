"""Hosts on one machine for tests: network namespaces joined by a bridge, as separate machines on one LAN.

`HostNetwork` creates a Linux bridge in the root namespace (the "infra" host: etcd and PostgreSQL bind its
address) and one network namespace per named host, each wired to the bridge by a veth pair and given its
own address on a /24 that no interface of this machine uses yet. A process started with `exec_argv(host,
argv)` (`ip netns exec`) sees only that host's interfaces: it binds the host's address and reaches the
others across the bridge, as it would across a LAN. The test process stays in the root namespace and
reaches every host.

Names carry a random tag, so parallel test runs do not clash; `close()` (always call it: fixtures with a
finalizer) deletes the namespaces (which removes their veth ends and the peers with them) and the bridge.
Needs root (CAP_NET_ADMIN) and iproute2: `unavailable_reason()` says why not, for a skip.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import uuid

IP_TIMEOUT_S = 10.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def unavailable_reason() -> str | None:
    """None when this process can create network namespaces and bridges; else why not (a skip reason)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install -y iproute2)"
    if os.geteuid() != 0:
        return "creating network namespaces and bridges needs root (CAP_NET_ADMIN); these tests run as a user"
    probe = f"lsp{uuid.uuid4().hex[:8]}"
    result = _ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"no permission to create network namespaces here: {result.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    result = _ip("link", "add", probe, "type", "bridge", check=False)
    if result.returncode != 0:
        return f"cannot create a bridge here (kernel module `bridge`?): {result.stderr.strip()}"
    _ip("link", "del", probe, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 that overlaps no address or route of this machine."""
    used = [
        ipaddress.ip_network(word, strict=False)
        for line in (_ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout).splitlines()
        for word in line.split()
        if word[:1].isdigit() and "/" in word
    ]
    for _ in range(100):
        candidate = ipaddress.IPv4Network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise RuntimeError("no free 10.x.y.0/24 for the test network")


class HostNetwork:
    """A bridge (the infra host's address) plus one network namespace per host; see the module docstring."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        tag = uuid.uuid4().hex[:6]
        self.subnet = _free_subnet()
        addresses = list(self.subnet.hosts())
        self.infra_ip = str(addresses[0])
        self.bridge = f"lsbr{tag}"
        self.namespaces = {host: f"lodestar-{host}-{tag}" for host in hosts}
        self.ips = {host: str(addresses[index + 1]) for index, host in enumerate(hosts)}
        self._veths: list[str] = []
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.infra_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for index, host in enumerate(hosts):
                self._wire(host, f"ls{index}{tag}")
        except BaseException:
            self.close()
            raise

    def _wire(self, host: str, veth: str) -> None:
        namespace, inside = self.namespaces[host], f"{veth}p"
        _ip("netns", "add", namespace)
        _ip("link", "add", veth, "type", "veth", "peer", "name", inside)
        self._veths.append(veth)
        _ip("link", "set", inside, "netns", namespace)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", namespace, "addr", "add", f"{self.ips[host]}/{self.subnet.prefixlen}", "dev", inside)
        _ip("-n", namespace, "link", "set", inside, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run inside `host`'s network namespace (`ip netns exec` execs it: the pid is argv's)."""
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def close(self) -> None:
        """Delete the namespaces, the veth pairs and the bridge (idempotent; processes are the caller's)."""
        for namespace in self.namespaces.values():
            _ip("netns", "del", namespace, check=False)
        for veth in self._veths:
            _ip("link", "del", veth, check=False)  # normally gone with its namespace's end
        _ip("link", "del", self.bridge, check=False)
