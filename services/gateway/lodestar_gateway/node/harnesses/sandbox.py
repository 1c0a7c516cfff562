"""The host runtime's sandbox: every process of a session (harness and verifier) under bubblewrap.

What a sandboxed process gets (`bwrap` from Debian's `bubblewrap`, 0.8 or later; built by `Sandbox.prepare`):

- an allow-list root (sandbox_root.py: the system directories, a minimal /etc, the node's Python and
  harness installs and the few lodestar files sessions run, all read-only; the files its run names; empty
  /tmp, /var/tmp, /run; a fresh /proc and a minimal /dev) and its own session root read-write at the fixed
  session root. Nothing else of the host is in it: no checkout, no data dir, no secret path, no repository
  source, no other session;
- its own user namespace, as uid/gid 1000, no capabilities, `no_new_privs`, and no further user namespaces
  (`--disable-userns`); its own PID, network (loopback only: the launcher relays the gateway's port in),
  IPC, UTS and cgroup namespaces;
- a seccomp filter (seccomp.py) and resource limits (`Limits`: rlimits set by netns_child.py before exec);
- on a root node, an unprivileged host uid (`user`): the session is not root outside. An outer bubblewrap
  (root, a mount namespace only) builds the allow-list root, `setpriv` drops to that uid, and the inner
  bubblewrap makes every namespace of the session inside it; so the uid needs no access to the node's
  directories (a Python installation below /root works). A root shell between the two (`_ROOT_KEEPER`)
  makes the inner one die with the outer, so a SIGKILLed node leaves no sandbox behind.

bwrap reads its options from a descriptor (`--args`), so the sandbox's pid 1 shows none of them in its
command line. Unprivileged user namespaces or root are needed; `available()` probes once with a real
sandboxed `true`. When the sandbox cannot run, sessions are refused (FailedPreconditionError: the session is
an infrastructure failure naming the cause). Known limits: docs/security.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lodestar.logging import get_logger
from lodestar_gateway.node.harnesses import seccomp
from lodestar_gateway.node.harnesses.sandbox_root import (
    SANDBOX_GID,
    SANDBOX_UID,
    Mount,
    masks,
    node_installation,
    root_mounts,
)

log = get_logger("gateway.harnesses.sandbox")

ROOT_NODE_SESSION_UID = 65532
"""The host uid (and gid) sessions run as on a root node (as the docker runtime's session containers)."""


def unprivileged_user() -> tuple[int, int] | None:
    """The host (uid, gid) bubblewrap runs as: ROOT_NODE_SESSION_UID on a root node (a session is never
    root outside), None (the node's own uid) otherwise."""
    return (ROOT_NODE_SESSION_UID, ROOT_NODE_SESSION_UID) if os.geteuid() == 0 else None


__all__ = ["SANDBOX_GID", "SANDBOX_UID", "Limits", "Prepared", "Sandbox", "node_installation", "node_sandbox"]


def node_sandbox(data_dir: Path, sessions_dir: Path, extra_hidden: Sequence[Path] = ()) -> Sandbox:
    """The sandbox of a gateway node's host sessions. Its data and sessions directories, the working
    directory's `.lodestar` and `extra_hidden` are outside the allow-list root; they are listed as hidden
    too, so a node that keeps one inside an installation sessions see gets it covered."""
    hidden = [data_dir, sessions_dir, Path.cwd() / ".lodestar", *extra_hidden]
    return Sandbox(hidden=[path.resolve() for path in hidden])


@dataclass(frozen=True)
class Limits:
    """Per-process resource limits of a sandboxed run (0: none), set as rlimits inside the sandbox."""

    processes: int = 0
    """RLIMIT_NPROC: processes of the session's uid (a user namespace of its own counts them per session)."""
    memory_bytes: int = 0
    """RLIMIT_AS of each process."""
    file_bytes: int = 0
    """RLIMIT_FSIZE: the largest file a process may write."""
    cpu_seconds: int = 0
    """RLIMIT_CPU of each process."""

    def child_args(self) -> list[str]:
        """netns_child.py's `--rlimit NAME=VALUE` options (core dumps are always off)."""
        values = {"NPROC": self.processes, "AS": self.memory_bytes, "FSIZE": self.file_bytes}
        values |= {"CPU": self.cpu_seconds, "CORE": 0}
        args: list[str] = []
        for name, value in values.items():
            if value or name == "CORE":
                args += ["--rlimit", f"{name}={value}"]
        return args


@dataclass
class Prepared:
    """One sandboxed run's bwrap command line and the descriptors it reads (pass them, then `close`)."""

    argv: list[str]
    fds: list[int]

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


@dataclass
class Sandbox:
    """Builds the bwrap invocation of a sandboxed run (module docstring)."""

    hidden: Sequence[Path] = ()
    """Node paths the session must not see: outside the root by construction; covered where they lie
    inside a visible tree."""
    readable: Sequence[Path] = field(default_factory=node_installation)
    """Read-only installations (besides the system directories) every run sees."""
    user: tuple[int, int] | None = field(default_factory=unprivileged_user)
    """Host (uid, gid) the session runs as (`unprivileged_user`); None: the node's own."""
    binary: str = "bwrap"
    _available: bool | None = field(default=None, init=False)
    _reason: str = field(default="", init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _filter: bytes = field(default=b"", init=False)

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
        try:
            prepared = self.prepare(binds=[], chdir=Path("/"))
        except (OSError, ValueError) as error:
            return False, f"the sandbox cannot be set up: {error}"
        try:
            process = await asyncio.create_subprocess_exec(
                *prepared.argv,
                "--",
                "true",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=prepared.fds,
            )
            prepared.close()
            _, err = await asyncio.wait_for(process.communicate(), timeout=30)
        except (OSError, TimeoutError) as error:
            return False, f"{self.binary} could not start: {error}"
        finally:
            prepared.close()
        if process.returncode != 0:
            return False, f"{self.binary} failed: {err.decode(errors='replace').strip()[:300]}"
        return True, ""

    def prepare(self, *, binds: Sequence[tuple[Path, Path]], chdir: Path, reads: Sequence[Path] = ()) -> Prepared:
        """`bwrap --args FD ...` up to (not including) the `--` before the program. `binds` (source, target)
        are the session's read-write directories, `reads` files or directories this run also sees read-only.
        Raises OSError when a descriptor cannot be made, ValueError when no seccomp filter exists here."""
        if not self._filter:
            self._filter = seccomp.program()
        home = str(binds[0][1] / "home") if binds else "/"
        mounts = root_mounts([*self.readable, *(path.resolve() for path in reads)], self.hidden, home)
        mounts += [Mount("rw", str(target), str(source)) for source, target in binds]
        mounts += masks(self.hidden, [target for _, target in binds])
        fds: list[int] = []
        try:
            inner = [*_namespaces(), "--seccomp", str(_memfd("seccomp", self._filter, fds)), "--chdir", str(chdir)]
            if self.user is None:
                argv = [self.binary, "--args", str(_args(["--proc", "/proc", "--dev", "/dev", *inner], mounts, fds))]
            else:  # the root node builds the root, then the unprivileged uid sandboxes itself inside it
                outer = _args(_ROOT_BUILDER, mounts, fds)
                uid, gid = (str(number) for number in self.user)
                switch = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
                argv = [self.binary, "--args", str(outer), "--", *_ROOT_KEEPER, *switch, self.binary]
                argv += ["--args", str(_args([*_INNER_ROOT, *inner], [], fds))]
        except BaseException:
            Prepared([], fds).close()
            raise
        return Prepared(argv, fds)


# Kept as laid out (the skip below): bwrap options with their values, as bwrap reads them.
_ROOT_BUILDER = [
    "--die-with-parent", "--bind", "/proc", "/proc", "--dev", "/dev",
    "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_KILL",
]  # fmt: skip
"""The outer bubblewrap of a root node (a mount namespace only): it builds the allow-list root as root (so
installations the session uid could not reach, e.g. below /root, can be bound) and keeps only what
`setpriv` needs to drop to the session uid, and CAP_KILL for `_ROOT_KEEPER`. The host's /proc is bound (not
a new one: bubblewrap would cover parts of it, and the kernel lets the inner one mount a fresh /proc only
over a fully visible one); the inner sandbox's own /proc covers it."""
_ROOT_KEEPER = ["sh", "-c", '"$@"; exit $?', "sh"]
"""Between the outer bubblewrap and `setpriv` on a root node: a root shell that stays the parent of the
inner bubblewrap (not `exec`: the command is not its last). `--die-with-parent` is a PR_SET_PDEATHSIG, and
the kernel sends a parent-death signal with the dying parent's credentials, as if that parent had called
kill(2): the outer bubblewrap's monitor (root, every capability dropped) may not signal the inner one (the
session uid), so without this the inner sandbox outlived a SIGKILLed node, reparented to init (issue 44,
docs/chaos.md). The outer monitor may signal this shell (both root; the shell dies with it), and the shell
holds CAP_KILL, so its death kills the inner bubblewrap, whose PID namespace ends with it. CAP_KILL does
not reach the session: `setpriv` clears every capability when it changes the uid."""
_INNER_ROOT = ["--bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
"""The inner bubblewrap's root: the outer's, whose read-only mounts stay read-only (locked)."""


def _args(options: list[str], mounts: Sequence[Mount], fds: list[int]) -> int:
    """A descriptor holding `options` and the mounts' options, NUL-separated (`bwrap --args`)."""
    every = [*options, *_mount_options(mounts, fds)]
    return _memfd("bwrap-args", b"".join(option.encode() + b"\0" for option in every), fds)


def _namespaces() -> list[str]:
    # Kept as laid out (the skip below): bwrap options with their values, as bwrap reads them.
    return [
        "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--disable-userns",
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
        "--hostname", "lodestar-session", "--die-with-parent", "--cap-drop", "ALL",
    ]  # fmt: skip


def _mount_options(mounts: Sequence[Mount], fds: list[int]) -> Iterator[str]:
    for mount in mounts:
        if mount.kind in ("ro", "rw"):
            yield from ("--ro-bind" if mount.kind == "ro" else "--bind", mount.source, mount.target)
        elif mount.kind == "symlink":
            yield from ("--symlink", mount.source, mount.target)
        elif mount.kind == "data":
            yield from ("--perms", "0444", "--ro-bind-data", str(_memfd("etc", mount.source.encode(), fds)))
            yield mount.target
        elif mount.kind == "dir":
            yield from ("--perms", "0755", "--dir", mount.target)
        elif mount.kind == "tmpfs":
            yield from ("--tmpfs", mount.target)


def _memfd(name: str, data: bytes, fds: list[int]) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    fds.append(fd)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
