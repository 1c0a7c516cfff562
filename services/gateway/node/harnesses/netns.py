"""Host half of network isolation: probe `unshare`, receive the in-namespace listeners, relay to the gateway.

A harness runs in a fresh network namespace that has only loopback (`unshare --net` as root;
`unshare --user --map-root-user --net` otherwise). `netns_child.py` binds the gateway's address and port
inside it and hands the listening sockets back here; `GatewayRelay` accepts on them (sockets keep the
namespace they were made in) and connects to the real gateway from the host namespace, copying bytes both
ways as they arrive (streams stay streams). When `unshare` is not usable, `NetworkIsolation.available()`
says so once with a log line and harnesses run without isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from lodestar.logging import get_logger

log = get_logger("gateway.harnesses.netns")

CHILD_SCRIPT = Path(__file__).with_name("netns_child.py")
_CHUNK = 64 * 1024


class NetworkIsolation:
    """Decides once whether harnesses can run in a loopback-only network namespace."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._prefix: list[str] | None = None
        self._probed = False

    def unshare_argv(self) -> list[str]:
        if os.geteuid() == 0:
            return ["unshare", "--net", "--"]
        return ["unshare", "--user", "--map-root-user", "--net", "--"]

    async def available(self) -> bool:
        """True when `unshare` works here (probed once; a log line says why not)."""
        if not self.enabled:
            return False
        if not self._probed:
            self._probed = True
            argv = [*self.unshare_argv(), "true"]
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                )
                _, err = await asyncio.wait_for(proc.communicate(), timeout=10)
                if proc.returncode == 0:
                    self._prefix = self.unshare_argv()
                else:
                    log.warning(
                        "network isolation unavailable; harnesses run without it",
                        probe=" ".join(argv),
                        error=err.decode(errors="replace").strip()[:300],
                    )
            except (OSError, TimeoutError) as exc:
                log.warning("network isolation unavailable; harnesses run without it", error=str(exc))
        return self._prefix is not None

    def wrap(self, argv: list[str], channel_fd: int, hosts: list[str], port: int) -> list[str]:
        """The argv that runs `argv` inside a new namespace via netns_child.py."""
        assert self._prefix is not None, "call available() first"
        child = [sys.executable, "-I", str(CHILD_SCRIPT), str(channel_fd), ",".join(hosts), str(port), "--"]
        return [*self._prefix, *child, *argv]


def gateway_address(base_url: str) -> tuple[str, int, list[str]]:
    """(host, port, addresses the harness may resolve the host to) of a gateway base URL."""
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    return host, port, addresses


async def receive_listeners(channel: socket.socket, timeout_s: float) -> list[socket.socket]:
    """Wait for netns_child.py's listening sockets; raise OSError with its message when it failed."""
    channel.setblocking(True)
    channel.settimeout(timeout_s)
    msg, fds, _, _ = await asyncio.to_thread(socket.recv_fds, channel, 4096, 16)
    if not fds:
        reason = msg.decode(errors="replace") or "the namespace helper exited before binding"
        raise OSError(f"network isolation set-up failed: {reason}")
    return [socket.socket(fileno=fd) for fd in fds]


class GatewayRelay:
    """Accepts on in-namespace listeners and pipes each connection to the gateway in the host namespace."""

    def __init__(self, listeners: list[socket.socket], target_host: str, target_port: int) -> None:
        self.listeners = listeners
        self.target = (target_host, target_port)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def start(self) -> None:
        for sock in self.listeners:
            sock.setblocking(False)
            self._servers.append(await asyncio.start_server(self._handle, sock=sock))

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        for server in self._servers:
            with contextlib.suppress(OSError):
                await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError as exc:
            log.warning("relay could not reach the gateway", target=self.target, error=str(exc))
            writer.close()
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()
