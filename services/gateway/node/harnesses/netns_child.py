"""In-namespace half of network isolation: runs as `unshare --net -- python -I netns_child.py ...`.

Standard library only (it runs with `python -I` and the harness's clean environment). Inside the fresh
network namespace it brings `lo` up, binds a listening TCP socket on each of the gateway's addresses and port (free: the
namespace is new), hands that socket to the launcher over an inherited Unix socket (SCM_RIGHTS), and
execs the harness in its own place (same pid, same process group). The launcher, in the host namespace,
accepts on the handed-over socket and relays each connection to the real gateway: the harness reaches
the gateway at its usual base URL and nothing else.

Usage: netns_child.py FD HOSTS PORT -- ARGV...   (HOSTS: comma-separated IP addresses)
Exit status 125 when set-up fails (after telling the launcher why).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import subprocess
import sys

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


def listen_on(host: str, port: int) -> socket.socket:
    address = ipaddress.ip_address(host)
    if not address.is_loopback:
        # The gateway's address does not exist in the new namespace: give it to lo.
        subprocess.run(["ip", "addr", "add", f"{host}/{address.max_prefixlen}", "dev", "lo"], check=True)
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def main(args: list[str]) -> int:
    fd, hosts, port, sep, *argv = args
    if sep != "--" or not argv:
        print("usage: netns_child.py FD HOSTS PORT -- ARGV...", file=sys.stderr)
        return 2
    channel = socket.socket(fileno=int(fd))
    try:
        loopback_up()
        listeners = [listen_on(host, int(port)) for host in hosts.split(",")]
    except (OSError, subprocess.CalledProcessError, ValueError) as exc:
        channel.sendall(f"error: {exc}".encode())
        return 125
    socket.send_fds(channel, [b"ok"], [listener.fileno() for listener in listeners])
    for listener in listeners:
        listener.close()
    channel.close()
    os.execvp(argv[0], argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
