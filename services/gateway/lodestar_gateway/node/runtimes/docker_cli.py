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

from lodestar.docker_refs import check_session_env
from lodestar.errors import FailedPreconditionError
from lodestar.logging import get_logger

_log = get_logger("gateway.node.docker")
DEFAULT_TIMEOUT_S = 60.0
CLIENT_ENV = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")
"""Variables of the node's environment the docker client itself needs (never passed into a session)."""
BY_VALUE = frozenset(
    {"PATH", "HOME", "TMPDIR", "GODEBUG", "SSL_CERT_FILE", "SSL_CERT_DIR"}
    | {f"{name}_PROXY" for name in ("HTTP", "HTTPS", "NO", "ALL")}
    | {f"{name}_proxy" for name in ("http", "https", "no", "all")}
)
"""Session variables the docker client itself would also read (its program search path, home, Go runtime,
TLS roots, proxies): `docker exec` gets them by value (`--env K=V`), never through the client's environment;
the others go by name, so secret values (the session key) never show in a process list."""


class DockerCli:
    """Runs `docker ...` commands (the binary found on PATH, or `binary`)."""

    def __init__(self, binary: str = "docker", *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.binary = shutil.which(binary) or binary
        self.timeout_s = timeout_s

    def client_env(self, session: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a docker client process: `session`'s variables that `docker exec` passes by name
        (InvalidArgumentError when it names a DOCKER_* variable), then the node's own client settings, which
        no session variable can replace: DOCKER_*, DOCKER_CONFIG (always set) and PATH."""
        check_session_env(session or {})
        env = {key: value for key, value in (session or {}).items() if key not in BY_VALUE}
        env.update({key: os.environ[key] for key in CLIENT_ENV if key in os.environ})
        env.setdefault("DOCKER_CONFIG", os.path.join(os.path.expanduser("~"), ".docker"))
        env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
        return env

    @staticmethod
    def env_args(session: Mapping[str, str]) -> list[str]:
        """`docker exec` flags that set `session`'s variables in the container: `--env NAME` (the value taken
        from `client_env(session)`), or `--env NAME=VALUE` for the names the client reads itself (BY_VALUE)."""
        check_session_env(session)
        return [
            arg for key, value in session.items() for arg in ("--env", f"{key}={value}" if key in BY_VALUE else key)
        ]

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
