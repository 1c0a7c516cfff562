"""The host runtime's sandbox: every process of a session (harness and verifier) under bubblewrap.

What a sandboxed process gets (`bwrap` from Debian's `bubblewrap`; argv built by `Sandbox.argv`):

- its own user namespace, as uid/gid 1000 with no capabilities and `no_new_privs` (setuid binaries do
  nothing); its own PID namespace (it sees only its own processes and cannot signal the node or another
  session; when the run ends, killing bwrap ends every process in it, daemons included); its own network
  namespace with only loopback (the launcher relays the gateway's port into it, nothing else is reachable);
  its own IPC and UTS namespaces; a fresh /proc, a minimal /dev;
- the host's file system read-only, so installed tools (harness binaries, Python, git, compilers) work
  unchanged, with the node's secrets hidden under empty tmpfs mounts: the node's data directory (capture
  store, session keys), the sessions directory (every other session's files), the working directory's
  `.lodestar` (stores, TLS keys of `lodestar up`), the node user's HOME (re-exposing, read-only, only the
  Python installation under it), /tmp, /var/tmp and /run (unix sockets such as Docker's);
- its own private root read-write at the fixed session root: HOME, TMPDIR and the workspace.

Unprivileged user namespaces or root are needed; `available()` probes once. When the sandbox cannot run,
sessions are refused (FailedPreconditionError: the session is an infrastructure failure naming the cause),
unless the node was started with `host_sandbox = "namespaces"`, the older and weaker isolation (network and
mount namespaces only), which it then logs as insecure.

Known limits: inside, the session's uid 1000 maps to the node's own uid outside (bwrap started by root maps
it to root without capabilities: writes are confined by the read-only mounts, not by file ownership); no CPU,
memory or process limits (RuntimeSpec limits apply on the docker runtime only); a gateway reachable only at
a non-loopback address cannot be relayed into the sandbox (use a loopback or wildcard `http_host`).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lodestar.logging import get_logger
from services.gateway.node.harnesses.base import REPO_ROOT

log = get_logger("gateway.harnesses.sandbox")

SANDBOX_UID = 1000
SANDBOX_GID = 1000
ALWAYS_HIDDEN = (Path("/tmp"), Path("/var/tmp"), Path("/run"))
"""Host directories replaced by an empty tmpfs in every sandbox (the session's own TMPDIR is bound in)."""


def node_installation() -> list[Path]:
    """What sessions run from (re-exposed read-only when it lies under a hidden path, e.g. a checkout in
    the node user's HOME): the node's Python and the lodestar tree (harness installs, netns_child.py)."""
    return sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), REPO_ROOT.resolve()})


def node_sandbox(data_dir: Path, sessions_dir: Path, extra_hidden: Sequence[Path] = ()) -> Sandbox:
    """The sandbox of a gateway node's host sessions: hides its data and sessions directories, the working
    directory's `.lodestar` (what `lodestar up` / `lodestar train` keep there: stores, TLS keys), the node
    user's HOME and `extra_hidden`."""
    hidden = [data_dir, sessions_dir, Path.cwd() / ".lodestar", Path.home(), *extra_hidden]
    return Sandbox(hidden=[path.resolve() for path in hidden])


@dataclass
class Sandbox:
    """Builds the bwrap command line of a sandboxed run (module docstring)."""

    hidden: Sequence[Path] = ()
    """Node paths the session must not see (each replaced by an empty tmpfs, if it exists)."""
    readable: Sequence[Path] = field(default_factory=node_installation)
    """Paths re-exposed read-only below a hidden one (the node's Python and the lodestar tree); a hidden path
    below one of them is hidden again after it."""
    binary: str = "bwrap"
    _available: bool | None = field(default=None, init=False)
    _reason: str = field(default="", init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    async def available(self) -> tuple[bool, str]:
        """(whether the sandbox runs here, why not), probed once with a real sandboxed `true`."""
        async with self._lock:
            if self._available is None:
                self._available, self._reason = await self._probe()
                if not self._available:
                    log.error("sandbox unavailable: sessions are refused", reason=self._reason)
            return self._available, self._reason

    async def _probe(self) -> tuple[bool, str]:
        if shutil.which(self.binary) is None:
            return False, f"{self.binary} is not installed (apt-get install bubblewrap)"
        argv = [*self.argv(binds=[], chdir=Path("/")), "--", "true"]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, err = await asyncio.wait_for(process.communicate(), timeout=30)
        except (OSError, TimeoutError) as error:
            return False, f"{self.binary} could not start: {error}"
        if process.returncode != 0:
            return False, f"{self.binary} failed: {err.decode(errors='replace').strip()[:300]}"
        return True, ""

    def argv(self, *, binds: Sequence[tuple[Path, Path]], chdir: Path) -> list[str]:
        """`bwrap ...` up to (not including) the `--` before the program; `binds` (source, target) are the
        session's read-write directories."""
        argv = [
            self.binary, "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--hostname", "lodestar-session",
            "--die-with-parent", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
        ]  # fmt: skip
        hidden = [path for path in [*ALWAYS_HIDDEN, *self.hidden] if path.is_dir()]
        exposed = [
            path
            for path in self.readable
            if path.is_dir() and any(path != above and path.is_relative_to(above) for above in hidden)
        ]
        for path in hidden:
            argv += ["--tmpfs", str(path)]
        for path in exposed:
            argv += ["--ro-bind", str(path), str(path)]
        for path in hidden:  # hidden again where a re-exposed tree holds it (.lodestar in a checkout in HOME)
            if any(path != above and path.is_relative_to(above) for above in exposed):
                argv += ["--tmpfs", str(path)]
        for source, target in binds:
            argv += ["--bind", str(source), str(target)]
        return [*argv, "--chdir", str(chdir)]
