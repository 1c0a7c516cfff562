"""What a session sandbox's root holds: the allow-list (docs/security.md lists it for users).

The root is bubblewrap's own empty tmpfs; only these go in it:

- the system directories programs run from, read-only: /usr, and /bin, /sbin, /lib, /lib32, /lib64,
  /libx32 (as the host's symlinks into /usr on a merged-usr system, bound otherwise); nothing else of the
  host's top level (no /home, /root, /opt, /srv, /var, /mnt, /media, /boot, no checkout, no data dir);
- a minimal /etc: synthesized `passwd`, `group` (root, the session user, nobody), `hosts` (loopback),
  `hostname` and `nsswitch.conf` (files only: no NSS module reaches a daemon), and, read-only from the host
  where present, only what programs read to run: the dynamic linker's cache and config, CA certificates
  (/etc/ssl/certs, not /etc/ssl/private), openssl.cnf, /etc/alternatives, the time zone, os-release,
  protocols/services, the shells' system rc files and Debian's /etc/python3*. No shadow files, no SSH host
  keys, no /etc/gitconfig, pip.conf or npmrc (they may hold credentials);
- the node's installations read-only (`node_installation`): its Python (base prefix and virtual
  environment), the harness installs (.harnesses), node.js where it lives outside /usr, and the few lodestar
  files sessions run (`SESSION_PROGRAMS`) — never the checkout as a whole: examples/, datasets, docs and task
  files stay out;
- per run, the files that run names (`reads`: the command harness's program, the python verifier's module);
- a fresh /proc, a minimal /dev, empty /tmp, /var/tmp and /run, and the session's own root read-write.

A path the node must not show that lies inside one of the above (the `hidden` list) is covered: a directory
by an empty tmpfs, anything else by an empty read-only file.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lodestar_gateway.node.harnesses.base import DEFAULT_BIN_DIR

SANDBOX_UID = 1000
SANDBOX_GID = 1000
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Kept as laid out (the skip below): a table of names below /etc; one per line would be 40 lines.
ETC_FROM_HOST = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
    "alternatives", "localtime", "timezone", "os-release", "debian_version", "protocols", "services",
    "mime.types", "host.conf", "gai.conf", "bash.bashrc", "profile", "inputrc", "environment",
    "python3", "python3.11", "python3.12", "python3.13",
)  # fmt: skip
"""Paths below /etc bound read-only from the host where present."""
EMPTY_DIRS = ("/tmp", "/var/tmp", "/run")
PACKAGE_DIR = Path(__file__).resolve().parents[2]
"""The installed `lodestar_gateway` package (in a checkout or in site-packages)."""
SESSION_PROGRAMS = (
    "node/harnesses/netns_child.py",
    "node/harnesses/openhands_driver.py",
    "node/verifiers/python_runner.py",
    "node/redteam/agents",
)
"""The lodestar files (relative to the `lodestar_gateway` package) that sessions run; nothing else of the
checkout is visible. A new program that runs inside a session is added here."""


@dataclass(frozen=True)
class Mount:
    """One entry of the sandbox's root. `kind`: "ro" (bind `source` read-only), "rw" (bind read-write),
    "symlink" (`source` is the link text), "data" (`source` is the file's text), "tmpfs", "dir"."""

    kind: str
    target: str
    source: str = ""


def node_installation() -> list[Path]:
    """What sessions run from, outside the system directories: the node's Python, the harness installs,
    node.js, and `SESSION_PROGRAMS` (those that exist)."""
    paths = [Path(sys.base_prefix), Path(sys.prefix), DEFAULT_BIN_DIR.parent.parent]
    node = shutil.which("node")
    if node:
        paths.append(Path(node).resolve().parent.parent)
    paths += [PACKAGE_DIR / program for program in SESSION_PROGRAMS]
    return sorted({path.resolve() for path in paths if path.exists() and not _in_system_dirs(path.resolve())})


def root_mounts(readable: Iterable[Path], hidden: Sequence[Path], home: str) -> list[Mount]:
    """The read-only part of the root (everything but /proc, /dev and the session's binds), in order."""
    mounts = [*_system_mounts(), *_etc_mounts(home), *(Mount("tmpfs", path) for path in EMPTY_DIRS)]
    exposed = [path for path in dict.fromkeys(readable) if path.exists() and path not in hidden]
    outside = [path for path in exposed if not _in_system_dirs(path)]
    parents = dict.fromkeys(parent for path in outside for parent in reversed(path.parents) if parent != Path("/"))
    mounts += [Mount("dir", str(parent)) for parent in parents]  # 0755: bubblewrap's own would be 0700
    mounts += [Mount("ro", str(path), str(path)) for path in outside]
    return mounts + masks(hidden, [*exposed, *(Path(d) for d in SYSTEM_DIRS), Path("/etc")])


def masks(hidden: Sequence[Path], visible: Sequence[Path]) -> list[Mount]:
    """Covers for each hidden path that lies inside a visible tree: an empty tmpfs over a directory, an empty
    read-only file over anything else."""
    covers = []
    for path in hidden:
        if not path.exists() or not any(path != top and path.is_relative_to(top) for top in visible):
            continue
        covers.append(Mount("tmpfs", str(path)) if path.is_dir() else Mount("data", str(path), ""))
    return covers


def _system_mounts() -> list[Mount]:
    mounts = []
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            mounts.append(Mount("symlink", name, os.readlink(path)))
        elif path.is_dir():
            mounts.append(Mount("ro", name, name))
    return mounts


def _etc_mounts(home: str) -> list[Mount]:
    mounts = [Mount("dir", "/etc")]
    for name, text in _synthesized_etc(home).items():
        mounts.append(Mount("data", f"/etc/{name}", text))
    nested = dict.fromkeys(parent for name in ETC_FROM_HOST for parent in reversed(Path(name).parents))
    for parent in nested:  # 0755 directories (/etc/ssl): bubblewrap's own would be 0700, closed to the session
        if parent != Path(".") and (Path("/etc") / parent).is_dir():
            mounts.append(Mount("dir", f"/etc/{parent}"))
    for name in ETC_FROM_HOST:
        path = Path("/etc") / name
        if path.is_symlink():
            mounts.append(Mount("symlink", str(path), os.readlink(path)))
        elif path.exists():
            mounts.append(Mount("ro", str(path), str(path)))
    return mounts


def _synthesized_etc(home: str) -> dict[str, str]:
    return {
        "passwd": (
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"agent:x:{SANDBOX_UID}:{SANDBOX_GID}:lodestar session:{home}:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
        "group": f"root:x:0:\nagent:x:{SANDBOX_GID}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1\tlocalhost lodestar-session\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "hostname": "lodestar-session\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nservices: files\n",
    }


def _in_system_dirs(path: Path) -> bool:
    return any(path.is_relative_to(top) for top in SYSTEM_DIRS if not Path(top).is_symlink())
