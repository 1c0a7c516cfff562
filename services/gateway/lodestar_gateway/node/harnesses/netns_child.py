"""In-namespace half of process isolation: runs as `unshare [--net] [--mount] -- python -I netns_child.py ...`.

Standard library only (it runs with `python -I` and the harness's clean environment). Before exec'ing the
program in its own place (same pid, same process group; with `--parent` as its child) it sets up what it was
asked for:

- `--bind SRC:DST` (repeatable, needs a mount namespace): bind-mount the directory SRC onto DST (created
  if missing). This is how every session sees the same absolute HOME/TMPDIR/workspace paths: its private
  directories are mounted onto fixed paths that only this process tree sees (`unshare --mount` makes the
  new namespace's mounts private, so nothing propagates back to the host).
- `--parent PID`: no process of the run outlives its node, even one SIGKILLed (PID: the node). The helper
  does not exec the program but stays as its keeper: the program runs as its child, every process the
  program starts stays below the keeper (PR_SET_CHILD_SUBREAPER: orphans are reparented to it, not to init,
  even after setsid), and when the node dies (PR_SET_PDEATHSIG delivers SIGCHLD, set here rather than in a
  preexec_fn, which would fork the node's multi-threaded gRPC process without exec'ing at once; a 1 s poll
  of the parent backs it) the keeper SIGKILLs every process below it and exits. A PDEATHSIG on the
  program alone would not do: it is not inherited by the program's children (a harness's tools). The
  keeper exits with the program's status (re-raising its signal); a SIGTERM to the process group is left
  to the program. Exit at once when the parent is already gone (no longer PID). The sandbox (bwrap, no
  `--parent`) needs no keeper: its PID namespace ends with its init, which dies with the node.
- `--chdir DIR`: change into DIR after the mounts (the launcher cannot start the process in a directory
  that exists only inside the namespace).
- `--listen HOSTS PORT` (needs a network namespace): bring `lo` up and bind a listening TCP socket on each
  of the gateway's addresses and port (free: the namespace is new). The launcher, in the host namespace,
  accepts on the handed-over sockets and relays each connection to the real gateway.
- `--loopback` (needs a network namespace): bring `lo` up and nothing else: a run that needs no gateway (a
  verifier) still has a working loopback (test suites bind local ports) and reaches nothing beyond it.
- `--rlimit NAME=VALUE` (repeatable; NAME one of NPROC, AS, FSIZE, CPU, CORE): set that resource limit
  (soft and hard) of the program, last of all before exec (the sandbox's limits).

The result goes back to the launcher over the inherited Unix socket FD: b"ok" (with the listening
sockets attached, SCM_RIGHTS) or b"error: ...".

Usage: netns_child.py FD [--parent PID] [--bind SRC:DST]... [--chdir DIR] [--listen HOSTS PORT | --loopback]
[--rlimit NAME=VALUE]... -- ARGV...
(HOSTS: comma-separated IP addresses). Exit status 125 when set-up fails (after telling the launcher why).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import ipaddress
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import time

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
MS_BIND = 4096
MS_REC = 16384
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def loopback_up() -> None:
    """Bring `lo` up unless it is (bwrap brings it up, and its sandbox has no capability to do it again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifreq))[1]
        if not flags & IFF_UP:
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


def listen_on(host: str, port: int) -> socket.socket:
    address = ipaddress.ip_address(host)
    if not (address.is_loopback or address.is_unspecified):
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


def bind_mount(source: str, target: str) -> None:
    """`mount --bind source target` (recursive), creating target first."""
    os.makedirs(target, exist_ok=True)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"bind mount {source} -> {target}: {os.strerror(errno)}")


KEEPER_SIGNALS = {signal.SIGCHLD, signal.SIGTERM}
"""Blocked in the keeper and taken with sigtimedwait: a child's exit or the node's death (SIGCHLD), and a
SIGTERM to the run's process group (the program's to act on; the keeper outlasts it)."""


def become_keeper(parent: int) -> None:
    """Prepare to keep the run (`--parent`): block KEEPER_SIGNALS, become the subreaper of every process
    below, be sent SIGCHLD when the parent dies; exit now if the parent already did."""
    signal.pthread_sigmask(signal.SIG_BLOCK, KEEPER_SIGNALS)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGCHLD)
    if os.getppid() != parent:
        os._exit(125)


def keep(parent: int, argv: list[str]) -> int:
    """Run `argv` as a child and wait for it; when `parent` dies first, SIGKILL every process below this one.
    Returns (or re-raises) the program's exit status."""
    program = os.fork()
    if program == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, KEEPER_SIGNALS)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"netns_child.py: {argv[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    while True:
        status = _reap(program)
        if status is not None:
            return _exit_as(status)
        if os.getppid() != parent:
            _kill_below(os.getpid())
            return 137
        signal.sigtimedwait(KEEPER_SIGNALS, 1.0)


def _reap(program: int) -> int | None:
    """Reap every exited child (the program and orphans reparented here); the program's wait status once it
    exited."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == program:
            found = status


def _exit_as(status: int) -> int:
    """The program's exit code, or its signal raised on this process (its parent reads the same status)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        return 128 + sig  # not reached
    return os.waitstatus_to_exitcode(status)


def _kill_below(root: int) -> None:
    """SIGKILL every live process below `root` until none is left (the killed ones' children are reparented
    to `root`, the subreaper, and found in the next round)."""
    for _ in range(200):
        below = _descendants(root)
        if not below:
            return
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(0)  # the killed children (no program is pid 0)
        time.sleep(0.01)


def _descendants(root: int) -> list[int]:
    """Live (not zombie) processes below `root`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    queue = list(children.get(root, []))
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue += children.get(pid, [])
    return found


Parsed = tuple[int, int | None, list[tuple[str, str]], str | None, tuple[str, int] | None, bool, list[str]]
RLIMITS = {
    "NPROC": resource.RLIMIT_NPROC,
    "AS": resource.RLIMIT_AS,
    "FSIZE": resource.RLIMIT_FSIZE,
    "CPU": resource.RLIMIT_CPU,
    "CORE": resource.RLIMIT_CORE,
}
_limits: list[tuple[int, int]] = []


def set_limits() -> None:
    """Apply the `--rlimit` options (lowering a limit needs no privilege)."""
    for which, value in _limits:
        resource.setrlimit(which, (value, value))


def parse(args: list[str]) -> Parsed:
    """(fd, parent, binds, chdir, (hosts, port) or None, loopback, argv); ValueError on a malformed command
    line."""
    fd, rest = int(args[0]), args[1:]
    parent: int | None = None
    binds: list[tuple[str, str]] = []
    chdir: str | None = None
    listen: tuple[str, int] | None = None
    loopback = False
    while rest and rest[0] != "--":
        option = rest.pop(0)
        if option == "--bind":
            source, _, target = rest.pop(0).partition(":")
            if not source or not target:
                raise ValueError("--bind needs SRC:DST")
            binds.append((source, target))
        elif option == "--parent":
            parent = int(rest.pop(0))
        elif option == "--chdir":
            chdir = rest.pop(0)
        elif option == "--listen":
            listen = (rest.pop(0), int(rest.pop(0)))
        elif option == "--loopback":
            loopback = True
        elif option == "--rlimit":
            name, _, value = rest.pop(0).partition("=")
            if name not in RLIMITS:
                raise ValueError(f"unknown rlimit {name}")
            _limits.append((RLIMITS[name], int(value)))
        else:
            raise ValueError(f"unknown option {option}")
    if not rest or len(rest) < 2:
        raise ValueError("missing -- ARGV")
    return fd, parent, binds, chdir, listen, loopback, rest[1:]


def main(args: list[str]) -> int:
    try:
        fd, parent, binds, chdir, listen, loopback, argv = parse(args)
    except (ValueError, IndexError) as exc:
        print(f"netns_child.py: {exc}", file=sys.stderr)
        return 2
    if parent is not None:
        become_keeper(parent)
    channel = socket.socket(fileno=fd)
    listeners: list[socket.socket] = []
    try:
        for source, target in binds:
            bind_mount(source, target)
        if chdir is not None:
            os.chdir(chdir)
        if listen is not None or loopback:
            loopback_up()
        if listen is not None:
            hosts, port = listen
            listeners = [listen_on(host, port) for host in hosts.split(",")]
        set_limits()
    except (OSError, subprocess.CalledProcessError, ValueError) as exc:
        channel.sendall(f"error: {exc}".encode())
        return 125
    if listeners:
        socket.send_fds(channel, [b"ok"], [listener.fileno() for listener in listeners])
    else:
        channel.sendall(b"ok")
    for listener in listeners:
        listener.close()
    channel.close()
    if parent is not None:
        return keep(parent, argv)
    os.execvp(argv[0], argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
