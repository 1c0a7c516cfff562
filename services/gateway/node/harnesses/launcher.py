"""Runs a prepared harness `Invocation`: its own process group, stdin=/dev/null, a timeout, output capture,
network isolation when available, and a process-group kill on every exit path (normal exit, timeout,
cancellation, error) so no tool process a harness started outlives its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass

from lodestar.logging import get_logger
from services.gateway.node.harnesses.base import Invocation
from services.gateway.node.harnesses.netns import (
    GatewayRelay,
    NetworkIsolation,
    gateway_address,
    receive_listeners,
)

log = get_logger("gateway.harnesses.launcher")

KILL_GRACE_S = 2.0
"""Time between SIGTERM and SIGKILL of the process group."""


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

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class Launcher:
    """Starts harness processes. One per node; it probes network isolation once."""

    def __init__(self, *, isolate_network: bool = True, max_output_bytes: int = 8 * 1024 * 1024) -> None:
        self.isolation = NetworkIsolation(enabled=isolate_network)
        self.max_output_bytes = max_output_bytes

    async def run(self, invocation: Invocation, gateway_url: str, timeout_s: float) -> HarnessResult:
        """Run `invocation` to completion or `timeout_s`, the harness reaching the gateway at `gateway_url`."""
        started = time.monotonic()
        isolated = await self.isolation.available()
        parent_end: socket.socket | None = None
        child_end: socket.socket | None = None
        relay: GatewayRelay | None = None
        argv = invocation.argv
        pass_fds: tuple[int, ...] = ()
        host, port, addresses = gateway_address(gateway_url)
        if isolated:
            parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            argv = self.isolation.wrap(argv, child_end.fileno(), addresses, port)
            pass_fds = (child_end.fileno(),)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=invocation.env,
            cwd=invocation.cwd,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        if child_end is not None:
            child_end.close()
        readers = [
            asyncio.create_task(self._read(proc.stdout)),
            asyncio.create_task(self._read(proc.stderr)),
        ]
        timed_out = False
        try:
            if parent_end is not None:
                listeners = await receive_listeners(parent_end, timeout_s=min(30.0, timeout_s))
                relay = GatewayRelay(listeners, host, port)
                await relay.start()
            remaining = timeout_s - (time.monotonic() - started)
            try:
                await asyncio.wait_for(proc.wait(), timeout=max(remaining, 0.001))
            except TimeoutError:
                timed_out = True
        finally:
            await _kill_group(proc)
            if parent_end is not None:
                parent_end.close()
            if relay is not None:
                await relay.close()
            done, pending = await asyncio.wait(readers, timeout=KILL_GRACE_S)
            for task in pending:
                task.cancel()
        out, err = (task.result() if task in done and not task.cancelled() else b"" for task in readers)
        returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        result = HarnessResult(
            harness=invocation.harness,
            returncode=returncode,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            isolated=isolated,
        )
        log.info(
            "harness run finished",
            harness=invocation.harness,
            returncode=result.returncode,
            timed_out=timed_out,
            duration_s=round(result.duration_s, 3),
            isolated=isolated,
            relayed_connections=relay.connections if relay else None,
        )
        return result

    async def _read(self, stream: asyncio.StreamReader | None) -> bytes:
        """Read a pipe to EOF, keeping at most max_output_bytes (the rest is drained and dropped)."""
        if stream is None:
            return b""
        kept = bytearray()
        while chunk := await stream.read(64 * 1024):
            room = self.max_output_bytes - len(kept)
            if room > 0:
                kept += chunk[:room]
        return bytes(kept)


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the process group (pgid = the harness pid), then SIGKILL what is left after a grace."""
    pgid = proc.pid
    if not _signal_group(pgid, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
        return
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and _group_alive(pgid):
        if proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=0.05)
        else:
            await asyncio.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    await proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
