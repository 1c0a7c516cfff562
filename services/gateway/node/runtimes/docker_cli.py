"""The docker CLI as asyncio subprocesses: every call has a timeout, and a failure is a
FailedPreconditionError that says which command failed and why (docker's own message). The only module
that runs `docker` (the node depends on the CLI, not on the Python SDK).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence

from lodestar.errors import FailedPreconditionError
from lodestar.logging import get_logger

_log = get_logger("gateway.node.docker")
DEFAULT_TIMEOUT_S = 60.0
CLIENT_ENV = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")
"""Variables of the node's environment the docker client itself needs (never passed into a session)."""


class DockerCli:
    """Runs `docker ...` commands (the binary found on PATH, or `binary`)."""

    def __init__(self, binary: str = "docker", *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.binary = shutil.which(binary) or binary
        self.timeout_s = timeout_s

    def client_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a docker client process: the node's DOCKER_* settings, plus `extra`."""
        env = {key: os.environ[key] for key in CLIENT_ENV if key in os.environ}
        if "DOCKER_CONFIG" not in env and "HOME" in os.environ:
            env["DOCKER_CONFIG"] = os.path.join(os.environ["HOME"], ".docker")
        env.update(extra or {})
        env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
        return env

    def argv(self, *args: str) -> list[str]:
        return [self.binary, *args]

    async def __call__(self, *args: str, timeout_s: float | None = None, check: bool = True) -> str:
        """Run `docker ARGS`; its stdout. FailedPreconditionError when it fails (with `check`) or times out."""
        limit = timeout_s or self.timeout_s
        what = f"docker {args[0]}" if args else "docker"
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(*args),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.client_env(),
            )
        except OSError as error:
            raise FailedPreconditionError(f"{what}: cannot run {self.binary}: {error.strerror}") from error
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=limit)
        except TimeoutError as error:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise FailedPreconditionError(f"{what} timed out after {limit:g} s") from error
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        if check and proc.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()
            raise FailedPreconditionError(f"{what} failed: {' '.join(message)[-600:] or f'exit {proc.returncode}'}")
        return out.decode(errors="replace")

    async def available(self) -> str | None:
        """None when the daemon answers; else why not."""
        try:
            await self("version", "--format", "{{.Server.Version}}", timeout_s=15)
        except FailedPreconditionError as error:
            return error.message
        return None

    async def remove(self, containers: Sequence[str], *, timeout_s: float = 60.0) -> None:
        """`docker rm -f` (volumes included); a container that is already gone is fine."""
        if not containers:
            return
        try:
            await self("rm", "-f", "-v", *containers, timeout_s=timeout_s)
        except FailedPreconditionError as error:
            if "No such container" not in error.message:
                raise

    async def labelled(self, label: str) -> list[str]:
        """Ids of every container (running or not) with `label` (`key=value`)."""
        out = await self("ps", "-aq", "--no-trunc", "--filter", f"label={label}")
        return out.split()
