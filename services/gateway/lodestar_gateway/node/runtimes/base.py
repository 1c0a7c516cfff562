"""The session runtime interface: where one session attempt's processes run, chosen per run by
`RuntimeSpec.kind` (`host`, `docker`; see docs/runtimes.md).

A `RuntimeBackend` creates a `SessionRuntime` in INIT (the attempt then waits in READY with it); RUN calls
`run_harness`, POST's verifier calls `run_process` (the `SessionProcess` of `verifiers/base.py`), and
`cleanup` runs on every exit path. Every runtime gives the session the same fixed paths
(`<fixed root>/{home,tmp,work}`), so the prompts of one group stay identical. Harness adapters write their
config files into `real` (the node's view of the session's directories); `translate` rewrites what they
prepared to `visible` (the session's view).

Also here: the private directories every runtime starts from (`stage_dirs`) and their removal, tmpfs
mounts included (`remove_dir`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from lodestar.errors import InvalidArgumentError
from lodestar.logging import get_logger
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import HarnessResult, Invocation, RunDirs

_log = get_logger("gateway.node.runtimes")
DEFAULT_FIXED_ROOT = Path("/tmp/lodestar-session")


class SessionRuntime(Protocol):
    """One session attempt's environment, from INIT to its cleanup."""

    kind: str
    root: Path
    """The session's private root on the node (home, tmp and work are below it); made by the node, so the
    session can change what is below it but not the root itself."""
    real: RunDirs
    """The session's directories as the node sees them (adapters write their config files here)."""
    visible: RunDirs
    """The same directories as the session's processes see them."""
    fixed_paths: bool
    """True when `visible` is the node's fixed root (identical paths for every session)."""
    owner: tuple[int, int] | None
    """The (uid, gid) the session's processes run as on the node's filesystem when it is not the node's own:
    the node gives the session's files to it before the harness runs, and the verifier's private
    directories (`verifiers/base.py`). None: the node's own uid (the host runtime's sandbox maps to it)."""
    limit_failure: str | None
    """Set by `run_harness` when the run hit a resource limit and the run asked for that to be an
    infrastructure failure (RuntimeSpec.options.on_limit = "infra")."""

    def translate(self, invocation: Invocation) -> Invocation:
        """An invocation prepared on `real`, rewritten to what the session's processes see."""
        ...

    async def run_harness(self, invocation: Invocation, gateway_url: str, timeout_s: float) -> HarnessResult:
        """Run the (translated) harness to completion or `timeout_s`, reaching the gateway at `gateway_url`
        and nothing else; every process it started is gone when this returns. FailedPreconditionError when
        it cannot start."""
        ...

    async def run_process(
        self, argv: list[str], env: Mapping[str, str], timeout_s: float, *, binds: Sequence[tuple[Path, Path]] = ()
    ) -> HarnessResult:
        """Run a process (a verifier) in the session: workspace as cwd, fixed paths, a clean environment plus
        `env`, no gateway; `binds` (node directory, target) are bound read-write into this run too (a runtime
        that cannot raises FailedPreconditionError)."""
        ...

    def details(self) -> dict[str, Any]:
        """What the session's result reports about its runtime (`verifier_details.runtime`)."""
        ...

    async def cleanup(self) -> None:
        """Remove everything the session had (processes, container, files). Idempotent, never raises."""
        ...


class RuntimeBackend(Protocol):
    """Creates the runtimes of one kind on this node."""

    kind: str

    async def create(
        self,
        name: str,
        files: Mapping[str, str],
        spec: rollout_pb2.RuntimeSpec | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> SessionRuntime:
        """A fresh runtime for attempt `name` with `files` in its workspace. `spec` is the run's runtime with
        the task's image resolved; `labels` name the session (for containers). Raises LodestarError (or
        OSError) when it cannot be prepared: the attempt is INFRA_FAILED."""
        ...

    async def remove_leftovers(self) -> int:
        """Remove what an earlier process of this node left behind (killed before its cleanup)."""
        ...


def translate_paths(invocation: Invocation, real: Path, seen: Path) -> Invocation:
    """`invocation` with every occurrence of `real` (argv, env, cwd and the config files the adapter wrote)
    replaced by `seen`."""
    for path in invocation.config_files:
        text = path.read_text(encoding="utf-8")
        if str(real) in text:
            path.write_text(text.replace(str(real), str(seen)), encoding="utf-8")
    old, new = str(real), str(seen)
    return replace(
        invocation,
        argv=[arg.replace(old, new) for arg in invocation.argv],
        env={key: value.replace(old, new) for key, value in invocation.env.items()},
        cwd=Path(str(invocation.cwd).replace(old, new)),
    )


def relative_file(path: str) -> PurePosixPath:
    """A task file path; InvalidArgumentError unless it is relative and stays inside the workspace."""
    relative = PurePosixPath(path)
    if not path or relative.is_absolute() or ".." in relative.parts:
        raise InvalidArgumentError(f"task file path {path!r} must be relative and stay inside the workspace")
    return relative


def stage_dirs(root: Path, files: Mapping[str, str], *, tmpfs_bytes: int = 0) -> RunDirs:
    """Fresh `root/{home,tmp,work}` with `files` written into `work` (any leftover at `root` is removed
    first). With `tmpfs_bytes`, `root` is a tmpfs of that size (needs root): the session's disk limit."""
    paths = {relative_file(path): content for path, content in files.items()}
    remove_dir(root)
    if tmpfs_bytes:
        root.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_bytes},mode=0755", "tmpfs", str(root)])
    dirs = RunDirs.under(root)
    for relative, content in paths.items():
        target = dirs.workdir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    return dirs


def remove_dir(root: Path) -> None:
    """Remove `root` and everything under it, unmounting any mount point at or below it first."""
    for mount_point in sorted(mounts_under(root), key=lambda path: len(path.parts), reverse=True):
        try:
            _run(["umount", "-l", str(mount_point)])
        except OSError as error:
            _log.warning("could not unmount a session directory", path=str(mount_point), error=str(error))
    shutil.rmtree(root, ignore_errors=True)


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below `root` (from /proc/self/mountinfo; empty where it cannot be read)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    base = os.path.realpath(root)
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].encode().decode("unicode_escape")  # octal escapes (\040 for a space)
            if point == base or point.startswith(base + "/"):
                found.append(Path(point))
    return found


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()[-300:]}")


async def remove_dir_async(root: Path) -> None:
    await asyncio.to_thread(remove_dir, root)
