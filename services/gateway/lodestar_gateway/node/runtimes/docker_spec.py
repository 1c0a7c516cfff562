"""What a session container of the `docker` runtime is, as pure functions: its `docker run` arguments
(isolation, limits, labels, mounts), the user its processes run as, the RuntimeSpec options it knows, the
mounts a run may ask for (only host paths the node allows), the node install it mounts, the harness PATH
inside it, and the counters that tell whether a session hit its limits.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from google.protobuf import json_format

from lodestar.docker_refs import check_image, check_mount_path, mount_value
from lodestar.errors import InvalidArgumentError, PermissionDeniedError
from lodestar.paths import confined
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses.base import DEFAULT_BIN_DIR, REPO_ROOT, SYSTEM_PATH

LABEL = "lodestar"
NODE_BIN = Path("/opt/lodestar/node/bin")
"""Where the node's Node.js binary is mounted in every container (first on PATH after the harness dirs)."""
ON_LIMIT = ("score", "infra")
ROOT_HOME = Path("/root")
SESSION_UID = 65532
"""The uid and gid of every session process when the node runs as root: never root, no capability, and
(unlike 1000) no human user of a typical host. lodestar/session-base names it `agent`."""


def session_user(euid: int | None = None) -> tuple[int, int]:
    """(uid, gid) that session containers run as: SESSION_UID on a root node; the node's own uid and gid
    otherwise (it cannot give its files to another uid, and is not root anyway)."""
    if (os.geteuid() if euid is None else euid) == 0:
        return SESSION_UID, SESSION_UID
    return os.getuid(), os.getgid()


def node_install(bin_dir: Path | None = None, extra: Sequence[str | Path] = ()) -> list[Path]:
    """Host paths mounted read-only, at the same path, into every session container: the harness install
    (the package tree of `bin_dir`), the node's Python environment (for `{python}` and the python
    verifier), lodestar's own code and example agent, and `extra` (RuntimeSpec.options.mounts, already
    checked by `allowed_mounts`)."""
    bins = (bin_dir or DEFAULT_BIN_DIR).resolve()
    harnesses = bins.parent.parent if bins.parent.name == "node_modules" else bins
    code = [REPO_ROOT / "lodestar", REPO_ROOT / "services", REPO_ROOT / "examples" / "agent"]
    paths = [harnesses, Path(sys.prefix), *code]
    base = Path(sys.base_prefix).resolve()
    if not str(base).startswith(("/usr", "/bin", "/lib")):
        paths.append(base)  # a self-built interpreter (pyenv, /opt): the venv's python links into it
    paths += [Path(item) for item in extra]
    existing = [path.resolve() for path in paths if path.exists()]
    return [path for path in dict.fromkeys(existing) if not any(path.is_relative_to(o) and path != o for o in existing)]


DOCKER_SOCKETS = (Path("/var/run/docker.sock"), Path("/run/docker.sock"), Path("/run/containerd/containerd.sock"))
"""Sockets that hand whoever can write them the container engine (root on the host): never mounted."""


def allowed_mounts(mounts: Sequence[str], allowed: Sequence[Path]) -> list[Path]:
    """RuntimeSpec.options.mounts resolved on this node, each one of the `allowed` host paths (the node's
    `--docker-mounts-allowed`) or below one; PermissionDeniedError naming the first that is not (with none
    allowed, every mount is refused), and for `/`, a socket or a directory holding the docker socket even
    when allowed. InvalidArgumentError for a path docker's `--mount` cannot carry as one field (a comma)."""
    for mount in mounts:
        check_mount_path(mount)
    resolved = [confined(mount, allowed, "docker mount", setting="--docker-mounts-allowed") for mount in mounts]
    for mount, path in zip(mounts, resolved, strict=True):
        if path == Path("/") or path.is_socket() or any(_holds(path, socket) for socket in DOCKER_SOCKETS):
            raise PermissionDeniedError(f"docker mount {mount!r} is refused: it exposes the host's root or docker")
    return resolved


def _holds(directory: Path, socket: Path) -> bool:
    real = Path(os.path.realpath(socket))
    return any(candidate == directory or candidate.is_relative_to(directory) for candidate in (socket, real))


def limits_argv(spec: rollout_pb2.RuntimeSpec) -> list[str]:
    """docker run flags of the RuntimeSpec's CPU, memory (no swap beyond it) and pids limits."""
    argv: list[str] = []
    if spec.cpus > 0:
        argv += ["--cpus", f"{spec.cpus:g}"]
    if spec.memory_bytes:
        argv += ["--memory", str(spec.memory_bytes), "--memory-swap", str(spec.memory_bytes)]
    if spec.pids_limit:
        argv += ["--pids-limit", str(spec.pids_limit)]
    return argv


def options_of(spec: rollout_pb2.RuntimeSpec) -> tuple[list[str], str]:
    """(extra read-only mounts, on_limit) from RuntimeSpec.options; InvalidArgumentError when malformed."""
    options = json_format.MessageToDict(spec.options)
    unknown = set(options) - {"mounts", "on_limit"}
    if unknown:
        raise InvalidArgumentError(f"docker runtime: unknown options {sorted(unknown)} (known: mounts, on_limit)")
    mounts = options.get("mounts", [])
    if not isinstance(mounts, list) or not all(isinstance(item, str) and item.startswith("/") for item in mounts):
        raise InvalidArgumentError("docker runtime: options.mounts must be a list of absolute host paths")
    on_limit = options.get("on_limit", "score")
    if on_limit not in ON_LIMIT:
        raise InvalidArgumentError(f"docker runtime: options.on_limit must be one of {', '.join(ON_LIMIT)}")
    return mounts, str(on_limit)


def container_path(path: str, mounted: Sequence[Path], image_path: str) -> str:
    """A harness PATH for the container: its entries under mounted install paths, the mounted Node.js, then
    the image's own PATH (which replaces the host's system directories)."""
    kept = [entry for entry in path.split(":") if entry and any(Path(entry).is_relative_to(m) for m in mounted)]
    return ":".join(dict.fromkeys([*kept, str(NODE_BIN), *(image_path or SYSTEM_PATH).split(":")]))


def run_argv(
    container: str,
    spec: rollout_pb2.RuntimeSpec,
    *,
    root: Path,
    fixed_root: Path,
    mounted: Sequence[Path],
    node: Path | None,
    labels: Mapping[str, str],
    user: tuple[int, int] = (SESSION_UID, SESSION_UID),
    root_mask: Path | None = None,
) -> list[str]:
    """`docker run` arguments of a session container: detached, `--init` (reaps orphans, forwards
    signals), never pulls, no network, no new privileges, every capability dropped, `user` (never root:
    ValueError for uid 0), the limits, `lodestar.*` labels, the session root on the fixed root, the node
    install read-only, `sleep infinity` as its process. Every `--mount` value is quoted by docker's CSV
    rules (`mount_value`) and the options end with `--` before the image (InvalidArgumentError for one that
    is no image reference: `check_image`), so no path or image of a spec adds a mount field or a flag.

    `root_mask`: an empty node directory (mode 0711) mounted over the image's /root when part of the node
    install lies below /root (a pyenv interpreter): the image's /root is 0700, which the session's user
    could not pass through to reach it."""
    if user[0] == 0:
        raise ValueError("a session container never runs as root")
    argv = ["run", "--detach", "--init", "--pull", "never", "--name", container, "--hostname", "lodestar-session"]
    argv += ["--network", "none", "--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
    argv += ["--user", f"{user[0]}:{user[1]}", *limits_argv(spec)]
    for key, value in labels.items():
        argv += ["--label", f"{LABEL}.{key}={value}"]
    argv += ["--mount", mount_value(type="bind", source=str(root), target=str(fixed_root))]
    below_root = [path for path in [*mounted, *([node] if node else [])] if path.is_relative_to(ROOT_HOME)]
    if root_mask is not None and below_root:
        argv += ["--mount", mount_value(type="bind", source=str(root_mask), target=str(ROOT_HOME))]
    for path in mounted:
        argv += ["--mount", mount_value(type="bind", source=str(path), target=str(path), readonly=None)]
    if node is not None:
        argv += ["--mount", mount_value(type="bind", source=str(node), target=str(NODE_BIN / "node"), readonly=None)]
    argv += ["--workdir", str(fixed_root / "work"), "--entrypoint", "sleep"]
    return [*argv, "--", check_image(spec.image), "infinity"]


def node_binary() -> Path | None:
    node = shutil.which("node")
    return Path(os.path.realpath(node)) if node else None


def cgroup_counters(pid: int, *, proc: Path = Path("/proc"), root: Path = Path("/sys/fs/cgroup")) -> dict[str, int]:
    """{"oom_kill": n, "pids_max": n} of process `pid`'s cgroups (v1 or v2; 0 where unreadable): how often
    the kernel OOM-killed in it and refused a fork at the pids limit."""
    counters = {"oom_kill": 0, "pids_max": 0}
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return counters
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        files = {
            "memory": [(root / "memory" / relative / "memory.oom_control", "oom_kill", "oom_kill")],
            "pids": [(root / "pids" / relative / "pids.events", "max", "pids_max")],
            "": [
                (root / relative / "memory.events", "oom_kill", "oom_kill"),
                (root / relative / "pids.events", "max", "pids_max"),
            ],
        }.get(controllers, [])
        for file, key, name in files:
            counters[name] = max(counters[name], _counter(file, key))
    return counters


def _counter(file: Path, key: str) -> int:
    try:
        for line in file.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key:
                return int(parts[1])
    except (OSError, ValueError):
        pass
    return 0


def disk_full(root: Path) -> bool:
    try:
        stat = os.statvfs(root)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < 64 * 1024
