"""Runs a prepared harness `Invocation`: its own process group, stdin=/dev/null, a timeout, output capture,
network isolation when available, optional bind mounts in a mount namespace of its own (fixed session
paths), and a process-group kill on every exit path (normal exit, timeout, cancellation, error) so no tool
process a harness started outlives its run.

With a `Sandbox` (sandbox.py; what a gateway node uses by default) every run, harness or verifier, goes
through bubblewrap instead: an allow-list root, user, PID, network, IPC, UTS and cgroup namespaces, seccomp,
rlimits, the session's directories bound read-write; a sandbox that cannot run refuses the run. Without
one, a run whose network namespace cannot be made is refused too (never run bare), unless the launcher was
built with `isolate_network=False` (tests of the launcher itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lodestar.errors import FailedPreconditionError
from lodestar.logging import get_logger
from lodestar_gateway.node.harnesses.base import Invocation
from lodestar_gateway.node.harnesses.netns import (
    DEFAULT_RELAY_CONNECTIONS,
    GatewayRelay,
    MountIsolation,
    NetworkIsolation,
    gateway_address,
    receive_setup,
    wrap,
)
from lodestar_gateway.node.harnesses.run_groups import RunGroups, live_processes
from lodestar_gateway.node.harnesses.sandbox import Limits, Prepared, Sandbox

log = get_logger("gateway.harnesses.launcher")

KILL_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL of the process group."""
POLL_S = 0.02
"""How often the harness's exit status is checked."""


@dataclass(frozen=True)
class HarnessResult:
    harness: str
    returncode: int
    """Exit status; negative signal number when killed (-9 after a timeout)."""
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    isolated: bool
    """True when the run had a loopback-only network namespace."""
    mounted: bool = False
    """True when the run's bind mounts were applied in a mount namespace of its own."""
    sandboxed: bool = False
    """True when the run was in the session sandbox (sandbox.py)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class Launcher:
    """Starts harness processes. One per node; it probes network isolation once."""

    def __init__(
        self,
        *,
        isolate_network: bool = True,
        mount_namespaces: bool = True,
        max_output_bytes: int = 8 * 1024 * 1024,
        sandbox: Sandbox | None = None,
        relay_connections: int = DEFAULT_RELAY_CONNECTIONS,
        groups: RunGroups | None = None,
    ) -> None:
        """`relay_connections`: connections a run may hold open to the gateway at once (more are closed);
        `groups`: where each run's process group is recorded while it runs (run_groups.py)."""
        self.groups = groups
        self.isolation = NetworkIsolation(enabled=isolate_network)
        self.relay_connections = relay_connections
        self.mounts = MountIsolation(enabled=mount_namespaces)
        self.max_output_bytes = max_output_bytes
        self.sandbox = sandbox
        """When set, every run is sandboxed (or refused); the namespace settings above are then unused."""

    def kill_leftovers(self) -> int:
        """Kill what is left of the runs of an earlier node process (killed mid-run); returns the processes."""
        return self.groups.kill_leftovers() if self.groups is not None else 0

    async def fixed_paths(self) -> bool:
        """Whether runs can see a session's directories at fixed paths (bind mounts)."""
        return self.sandbox is not None or await self.mounts.available()

    async def run(
        self,
        invocation: Invocation,
        gateway_url: str | None,
        timeout_s: float,
        *,
        binds: Sequence[tuple[Path, Path]] = (),
        limits: Limits | None = None,
    ) -> HarnessResult:
        """Run `invocation` to completion or `timeout_s`, the harness reaching the gateway at `gateway_url`
        (None: nothing is relayed, e.g. a verifier command). Every run gets a loopback-only network namespace
        of its own where this machine allows one (always in the sandbox), so a verifier, which runs the
        agent's code, reaches no local service either.

        `binds` (source, target) directories are bind-mounted in a mount namespace of the run's own before
        the program starts in `invocation.cwd` (which may be a target path); check `self.mounts.available()`
        first. `limits` apply in the sandbox only. Raises FailedPreconditionError when the binary cannot start
        or the namespace set-up fails.
        """
        started = time.monotonic()
        wrapping = await self._wrapping(invocation, gateway_url, binds, limits or Limits())
        pipes = _Pipes(self.max_output_bytes)
        relay: GatewayRelay | None = None
        setup_error: OSError | None = None
        timed_out = False
        # Torn down in this order on every exit path: the processes (the group, then what is left in the run's
        # mount namespace), the set-up socket, the relay, the pipe readers. Stacks unwind last in, first out;
        # what must outlive the processes is on `outliving`, which unwinds after `running`.
        async with contextlib.AsyncExitStack() as outliving, contextlib.AsyncExitStack() as running:
            outliving.push_async_callback(pipes.settle)
            proc, channel = await self._start(invocation, wrapping, running)
            if self.groups is not None:
                self.groups.started(proc.pid)
                running.callback(self.groups.ended, proc.pid)  # once the group is ended (the next callback)
            processes = _RunProcesses(proc)
            running.push_async_callback(processes.end)
            pipes.read(proc)
            if channel is not None:
                try:
                    listeners = await receive_setup(channel, timeout_s=min(30.0, timeout_s))
                except OSError as exc:
                    setup_error = exc
                else:
                    if binds and wrapping.sandboxed is None:  # bwrap's PID namespace ends them all
                        processes.hold_mount_namespace()
                    if wrapping.relayed:
                        relay = GatewayRelay(
                            listeners, wrapping.host, wrapping.port, max_connections=self.relay_connections
                        )
                        outliving.push_async_callback(relay.close)
                        await relay.start()
            if setup_error is None:
                timed_out = not await _exited(proc, deadline=started + timeout_s)
        out, err = pipes.output()
        if setup_error is not None:
            detail = err.decode("utf-8", errors="replace").strip()[-500:]
            raise FailedPreconditionError(f"{invocation.harness}: {setup_error}" + (f" ({detail})" if detail else ""))
        result = HarnessResult(
            harness=invocation.harness,
            returncode=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            isolated=wrapping.network or wrapping.sandboxed is not None,
            mounted=bool(binds),
            sandboxed=wrapping.sandboxed is not None,
        )
        _log_finished(result, relay=relay)
        return result

    async def _wrapping(
        self, invocation: Invocation, gateway_url: str | None, binds: Sequence[tuple[Path, Path]], limits: Limits
    ) -> _Wrapping:
        """How this run is wrapped: in the sandbox, or in the namespaces this machine allows; raises
        FailedPreconditionError when what the run needs cannot run here."""
        sandboxed: Prepared | None = None
        if self.sandbox is not None:
            ready, reason = await self.sandbox.available()
            if not ready:
                raise FailedPreconditionError(f"{invocation.harness}: the session sandbox cannot run here: {reason}")
            try:
                sandboxed = self.sandbox.prepare(binds=binds, chdir=invocation.cwd, reads=invocation.reads)
            except (OSError, ValueError) as error:
                raise FailedPreconditionError(f"{invocation.harness}: the session sandbox: {error}") from error
            network = False  # bwrap makes the loopback-only namespace itself
            relayed = gateway_url is not None
        else:
            network = await self.isolation.available()
            if self.isolation.enabled and not network:
                raise FailedPreconditionError(f"{invocation.harness}: network isolation (unshare) cannot run here")
            if self.mounts.enabled and not await self.mounts.available():
                raise FailedPreconditionError(f"{invocation.harness}: mount namespaces (unshare) cannot run here")
            relayed = network and gateway_url is not None
            if binds and not await self.mounts.available():
                raise FailedPreconditionError(f"{invocation.harness}: bind mounts need mount namespaces (unavailable)")
        host, port, addresses = gateway_address(gateway_url) if relayed and gateway_url else ("", 0, [])
        return _Wrapping(binds, sandboxed, network, relayed, host, port, addresses, limits)

    async def _start(
        self, invocation: Invocation, wrapping: _Wrapping, cleanup: contextlib.AsyncExitStack
    ) -> tuple[asyncio.subprocess.Process, socket.socket | None]:
        """Start the run: directly, or through the namespace helper (netns_child.py) with a set-up socket
        (returned; closed by `cleanup`) that reports when the namespaces are ready."""
        binds, sandboxed = wrapping.binds, wrapping.sandboxed
        if not (wrapping.network or binds or sandboxed):
            return await self._spawn(invocation, invocation.argv, ()), None
        channel, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cleanup.callback(channel.close)
        with child_end, contextlib.ExitStack() as descriptors:
            fds = [child_end.fileno()]
            if sandboxed is not None:
                descriptors.callback(sandboxed.close)
                fds += sandboxed.fds
            argv = wrap(
                invocation.argv,
                child_end.fileno(),
                listen=(wrapping.addresses, wrapping.port) if wrapping.relayed else None,
                network=wrapping.network,
                binds=list(binds),
                chdir=invocation.cwd if binds else None,
                sandbox=sandboxed.argv if sandboxed else None,
                rlimits=wrapping.limits.child_args() if sandboxed else None,
            )
            # Inside the namespace the helper changes into the (possibly mount-only) working directory.
            cwd = Path("/") if binds or sandboxed else None
            return await self._spawn(invocation, argv, tuple(fds), cwd=cwd), channel

    async def _spawn(
        self,
        invocation: Invocation,
        argv: list[str],
        pass_fds: tuple[int, ...],
        *,
        cwd: Path | None = None,
    ) -> asyncio.subprocess.Process:
        """Start the process in a new session (its pid is the process group id), stdin=/dev/null."""
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=invocation.env,
                cwd=cwd or invocation.cwd,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except OSError as exc:
            raise FailedPreconditionError(f"{invocation.harness}: cannot start {argv[0]}: {exc.strerror}") from exc


@dataclass(frozen=True)
class _Wrapping:
    """How one run is wrapped (`Launcher._wrapping`)."""

    binds: Sequence[tuple[Path, Path]]
    sandboxed: Prepared | None
    """The sandbox's bwrap invocation; None: no sandbox."""
    network: bool
    """A loopback-only network namespace made here (unshare; the sandbox makes its own)."""
    relayed: bool
    """The gateway at (host, port) relayed into the run's network namespace."""
    host: str
    port: int
    addresses: list[str]
    """What the harness may resolve the gateway host to (its listeners in the namespace)."""
    limits: Limits


class _RunProcesses:
    """A run's processes: its process group and, with binds, its mount namespace (`hold_mount_namespace`)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.mount_ns: str | None = None
        self.mount_ns_fd: int | None = None

    def hold_mount_namespace(self) -> None:
        self.mount_ns, self.mount_ns_fd = _hold_mount_namespace(self.proc.pid)

    async def end(self) -> None:
        """Kill the process group, then whatever is left in the mount namespace."""
        await _kill_group(self.proc)
        if self.mount_ns is not None:
            # Processes that left the group (setsid, daemonized tools) still share the run's mount namespace.
            # The held descriptor keeps the namespace alive until the sweep is done, so its inode number
            # cannot be reused by another session's new namespace (whose processes the sweep would kill).
            _kill_namespace(self.mount_ns)
        if self.mount_ns_fd is not None:
            os.close(self.mount_ns_fd)


class _Pipes:
    """A run's stdout and stderr, each read to EOF by a task that keeps at most `max_bytes` (the rest is drained
    and dropped)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._readers: list[asyncio.Task[bytes]] = []
        self._done: set[asyncio.Task[bytes]] = set()

    def read(self, proc: asyncio.subprocess.Process) -> None:
        self._readers = [asyncio.create_task(self._read(proc.stdout)), asyncio.create_task(self._read(proc.stderr))]

    async def settle(self) -> None:
        """Give the readers a grace to reach EOF (a process that left the group may hold a pipe), then stop them."""
        if not self._readers:
            return
        self._done, pending = await asyncio.wait(self._readers, timeout=KILL_GRACE_S)
        for task in pending:
            task.cancel()

    def output(self) -> tuple[bytes, bytes]:
        """(stdout, stderr) as read; empty for a reader that did not finish."""
        out, err = (task.result() if task in self._done and not task.cancelled() else b"" for task in self._readers)
        return out, err

    async def _read(self, stream: asyncio.StreamReader | None) -> bytes:
        if stream is None:
            return b""
        kept = bytearray()
        while chunk := await stream.read(64 * 1024):
            room = self.max_bytes - len(kept)
            if room > 0:
                kept += chunk[:room]
        return bytes(kept)


def _log_finished(result: HarnessResult, *, relay: GatewayRelay | None) -> None:
    log.info(
        "harness run finished",
        harness=result.harness,
        returncode=result.returncode,
        timed_out=result.timed_out,
        duration_s=round(result.duration_s, 3),
        isolated=result.isolated,
        mounted=result.mounted,
        sandboxed=result.sandboxed,
        relayed_connections=relay.connections if relay else None,
    )


async def _exited(proc: asyncio.subprocess.Process, deadline: float) -> bool:
    """Wait for the harness itself to exit (True) or the deadline (False).

    Not `proc.wait()`: asyncio resolves it only once every pipe is closed too, and a background process
    the harness left behind holds stdout open; the exit status is known (and polled here) before that.
    """
    while proc.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the process group (pgid = the harness pid), then SIGKILL what is left after a grace."""
    pgid = proc.pid
    if not _signal_group(pgid, signal.SIGTERM):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=KILL_GRACE_S)
        return
    deadline = time.monotonic() + KILL_GRACE_S
    # Polled: no event reports the death of the last member of a process group.
    while time.monotonic() < deadline and (proc.returncode is None or _group_alive(pgid)):  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    _signal_group(pgid, signal.SIGKILL)
    # A process that left the group (setsid) may still hold the pipes: do not wait on it forever.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), timeout=KILL_GRACE_S)


def _mount_namespace(pid: int) -> str | None:
    """The mount namespace of `pid` (e.g. "mnt:[4026532301]"), or None when it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _hold_mount_namespace(pid: int) -> tuple[str | None, int | None]:
    """(the mount namespace of `pid`, a descriptor that keeps it alive), or (None, None) when unreadable."""
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None, None
    name = _mount_namespace(pid)
    if name is None or os.readlink(f"/proc/self/fd/{fd}") != name:  # pid gone or reused in between
        os.close(fd)
        return None, None
    return name, fd


def _kill_namespace(mount_ns: str) -> int:
    """SIGKILL every process in mount namespace `mount_ns` (a run's own); returns how many were signalled."""
    if mount_ns == _mount_namespace(os.getpid()):
        return 0  # never the node's own namespace
    killed = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _mount_namespace(int(entry.name)) == mount_ns:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    if killed:
        log.info("killed processes left in the run's mount namespace", count=killed)
    return killed


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """True while a non-zombie process of the group exists (zombies wait for a slow init to reap them)."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return any(group == pgid for _, group, _ in live_processes())
