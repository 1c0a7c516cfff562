"""Host half of network isolation: probe `unshare`, receive the in-namespace listeners, relay to the gateway.

A harness runs in a fresh network namespace that has only loopback (`unshare --net` as root;
`unshare --user --map-root-user --net` otherwise). `netns_child.py` binds the gateway's address and port
inside it and hands the listening sockets back here; `GatewayRelay` accepts on them (sockets keep the
namespace they were made in) and connects to the real gateway from the host namespace, copying bytes both
ways as they arrive (streams stay streams). When `unshare` is not usable, `NetworkIsolation.available()`
says so once with a log line and harnesses run without isolation. A verifier (a run without a gateway)
gets a loopback-only namespace of its own too, with nothing relayed into it.

The same helper gives a run its own mount namespace (`unshare --mount`, probed separately by
`MountIsolation`): the launcher passes bind mounts (a session's private directories onto fixed paths) and
the helper mounts them before exec, so every session sees the same absolute paths.
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
DEFAULT_RELAY_CONNECTIONS = 64
"""Connections one run may hold open through its relay at once (the gateway setting relay_max_connections)."""


def _user_flags() -> list[str]:
    """Root may unshare directly; anyone else needs a user namespace that maps them to root."""
    return [] if os.geteuid() == 0 else ["--user", "--map-root-user"]


async def _probe(argv: list[str], what: str) -> bool:
    """True when `argv` (an unshare of `true`) exits 0; one warning line when it does not."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), timeout=10)
    except (OSError, TimeoutError) as exc:
        log.warning(f"{what} unavailable", probe=" ".join(argv), error=str(exc))
        return False
    if proc.returncode != 0:
        log.warning(f"{what} unavailable", probe=" ".join(argv), error=err.decode(errors="replace").strip()[:300])
        return False
    return True


class NetworkIsolation:
    """Decides once whether harnesses can run in a loopback-only network namespace."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._prefix: list[str] | None = None
        self._probed = False
        self._lock = asyncio.Lock()

    def unshare_argv(self) -> list[str]:
        return ["unshare", *_user_flags(), "--net", "--"]

    async def available(self) -> bool:
        """True when `unshare` works here (probed once; a log line says why not)."""
        if not self.enabled:
            return False
        async with self._lock:  # concurrent first runs wait for the one probe
            if not self._probed:
                argv = self.unshare_argv()
                if await _probe([*argv, "true"], "network isolation (harnesses run without it)"):
                    self._prefix = argv
                self._probed = True
        return self._prefix is not None


class MountIsolation:
    """Decides once whether runs can get their own mount namespace (for fixed-path bind mounts)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._available: bool | None = None
        self._lock = asyncio.Lock()

    async def available(self) -> bool:
        if not self.enabled:
            return False
        async with self._lock:
            if self._available is None:
                argv = ["unshare", *_user_flags(), "--mount", "--", "true"]
                self._available = await _probe(argv, "mount namespaces (sessions see their real paths)")
            return self._available


def wrap(
    argv: list[str],
    channel_fd: int,
    *,
    listen: tuple[list[str], int] | None = None,
    network: bool = False,
    binds: list[tuple[Path, Path]] | None = None,
    chdir: Path | None = None,
    sandbox: list[str] | None = None,
    rlimits: list[str] | None = None,
) -> list[str]:
    """The argv that runs `argv` inside new namespaces via netns_child.py: a loopback-only network namespace
    when `listen` (gateway addresses, port: relayed in) is given or `network` is set (nothing relayed: a
    verifier), a mount namespace when `binds` are. With `sandbox` (a `Sandbox.argv`, which does the binds,
    the directory change and every namespace itself) netns_child.py runs inside bwrap and only opens the
    gateway listeners and sets `rlimits` (its `--rlimit NAME=VALUE` options)."""
    if sandbox is not None:
        child = [sys.executable, "-I", str(CHILD_SCRIPT), str(channel_fd), *(rlimits or [])]
        if listen is not None:
            child += ["--listen", ",".join(listen[0]), str(listen[1])]
        return [*sandbox, "--", *child, "--", *argv]
    flags = _user_flags()
    if listen is not None or network:
        flags.append("--net")
    if binds:
        flags.append("--mount")
    child = [sys.executable, "-I", str(CHILD_SCRIPT), str(channel_fd), "--parent", str(os.getpid())]
    for source, target in binds or []:
        child += ["--bind", f"{source}:{target}"]
    if chdir is not None:
        child += ["--chdir", str(chdir)]
    if listen is not None:
        child += ["--listen", ",".join(listen[0]), str(listen[1])]
    elif network:
        child.append("--loopback")
    return ["unshare", *flags, "--", *child, "--", *argv]


def gateway_address(base_url: str) -> tuple[str, int, list[str]]:
    """(host, port, addresses the harness may resolve the host to) of a gateway base URL."""
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    return host, port, addresses


async def receive_setup(channel: socket.socket, timeout_s: float) -> list[socket.socket]:
    """Wait for netns_child.py's "ok" (and its listening sockets, if any); raise OSError with its message
    when set-up failed."""
    channel.setblocking(True)
    channel.settimeout(timeout_s)
    msg, fds, _, _ = await asyncio.to_thread(socket.recv_fds, channel, 4096, 16)
    if msg != b"ok":
        for fd in fds:
            os.close(fd)
        reason = msg.decode(errors="replace") or "the namespace helper exited before set-up"
        raise OSError(f"namespace set-up failed: {reason}")
    return [socket.socket(fileno=fd) for fd in fds]


class GatewayRelay:
    """Accepts on in-namespace listeners and pipes each connection to the gateway in the host namespace; at
    most `max_connections` at once (each holds node file descriptors and a gateway connection): one past it
    is closed as soon as it is accepted."""

    def __init__(
        self,
        listeners: list[socket.socket],
        target_host: str,
        target_port: int,
        *,
        max_connections: int = DEFAULT_RELAY_CONNECTIONS,
    ) -> None:
        self.listeners = listeners
        self.target = (target_host, target_port)
        self.max_connections = max_connections
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        self.refused = 0

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
        if len(self._tasks) >= self.max_connections:
            self.refused += 1
            if self.refused == 1:
                log.warning(
                    "relay refused a connection: the run holds its maximum", max_connections=self.max_connections
                )
            writer.close()
            return
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
