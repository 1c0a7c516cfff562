"""The `host` runtime: the session's processes run on the node's host in the session sandbox
(`harnesses/sandbox.py`: an allow-list root in which the session's private root is bound onto the fixed root,
default `/tmp/lodestar-session`, and a loopback-only network namespace that reaches only this gateway).

Each session attempt gets `<sessions_dir>/<name>/{home,tmp,work}` with the task's files in `work`; the
sessions directory is mode 0700 (no other host user reaches a session's files, a setuid file made in one
included). On a root node the sandbox runs sessions as an unprivileged uid (`Sandbox.user`): the node gives
home, tmp and work to it before the first process runs. The RuntimeSpec's pids, memory and disk limits
apply as rlimits (`Limits`: per process, except the process count); its CPU limit needs cgroups and is not
applied here (docs/runtimes.md). Without a sandbox (the launcher's own namespaces, for tests), when mount
namespaces are unavailable, sessions see their real paths (`fixed_paths` False).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import HarnessResult, Invocation, Launcher, RunDirs
from lodestar_gateway.node.harnesses.base import clean_env
from lodestar_gateway.node.harnesses.sandbox import Limits
from lodestar_gateway.node.runtimes.base import DEFAULT_FIXED_ROOT, remove_dir, stage_dirs, translate_paths
from lodestar_gateway.node.runtimes.host_files import private_sessions_dir, verifier_reads
from lodestar_gateway.node.safe_files import give_tree


@dataclass
class HostRuntime:
    """The directories of one session attempt on the host (see the module docstring)."""

    root: Path
    """The real private root (removed by `cleanup`)."""
    real: RunDirs
    visible: RunDirs
    fixed_paths: bool
    launcher: Launcher
    kind: str = "host"
    owner: tuple[int, int] | None = None
    limit_failure: str | None = None
    limits: Limits = field(default_factory=Limits)
    _handed_over: bool = False

    @property
    def binds(self) -> list[tuple[Path, Path]]:
        """Bind mounts every process of the session runs under."""
        return [(self.root, self.visible.home.parent)] if self.fixed_paths else []

    def translate(self, invocation: Invocation) -> Invocation:
        if not self.fixed_paths:
            return invocation
        return translate_paths(invocation, self.root, self.visible.home.parent)

    async def run_harness(self, invocation: Invocation, gateway_url: str, timeout_s: float) -> HarnessResult:
        await self._hand_over()
        return await self.launcher.run(invocation, gateway_url, timeout_s, binds=self.binds, limits=self.limits)

    async def run_process(
        self, argv: list[str], env: Mapping[str, str], timeout_s: float, *, binds: Sequence[tuple[Path, Path]] = ()
    ) -> HarnessResult:
        """`binds`: node directories bound into this run too (the swe verifier's scoring directory)."""
        await self._hand_over()
        invocation = Invocation(
            "verifier", argv, clean_env(self.visible, extra=env), self.visible.workdir, reads=verifier_reads(argv)
        )
        return await self.launcher.run(invocation, None, timeout_s, binds=[*self.binds, *binds], limits=self.limits)

    async def _hand_over(self) -> None:
        """Before the session's first process: give home, tmp and work (written by the node; nothing of the
        session has run yet, so no link in them is the agent's) to the sandbox's uid. The root stays the
        node's."""
        if self.owner is None or self._handed_over:
            return
        for tree in (self.real.home, self.real.tmpdir, self.real.workdir):
            await asyncio.to_thread(give_tree, tree, self.owner)
        self._handed_over = True

    def details(self) -> dict[str, Any]:
        """As before runtimes had kinds: a result without `kind` in its runtime details ran on the host."""
        return {"fixed_paths": self.fixed_paths}

    async def cleanup(self) -> None:
        """Remove every file of the session (its processes are gone: the launcher kills them)."""
        await asyncio.to_thread(remove_dir, self.root)


def _limits(spec: rollout_pb2.RuntimeSpec | None) -> Limits:
    if spec is None:
        return Limits()
    return Limits(processes=spec.pids_limit, memory_bytes=spec.memory_bytes, file_bytes=spec.disk_bytes)


class HostBackend:
    """Creates host runtimes under one directory of the node."""

    kind = "host"

    def __init__(self, sessions_dir: Path, launcher: Launcher, *, fixed_root: Path = DEFAULT_FIXED_ROOT) -> None:
        self.sessions_dir = sessions_dir
        self.fixed_root = fixed_root
        self._launcher = launcher

    async def create(
        self,
        name: str,
        files: Mapping[str, str],
        spec: rollout_pb2.RuntimeSpec | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> HostRuntime:
        """Fresh directories for `name` (any leftover of that name is removed first) with `files` written
        into the workspace. InvalidArgumentError for a file path outside the workspace."""
        root = self.sessions_dir / name
        fixed = await self._launcher.fixed_paths()
        await asyncio.to_thread(private_sessions_dir, self.sessions_dir)
        real = await asyncio.to_thread(stage_dirs, root, files)
        visible = RunDirs(self.fixed_root / "home", self.fixed_root / "tmp", self.fixed_root / "work")
        sandbox = self._launcher.sandbox
        owner = sandbox.user if sandbox is not None else None
        return HostRuntime(
            root, real, visible if fixed else real, fixed, self._launcher, owner=owner, limits=_limits(spec)
        )

    async def remove_leftovers(self) -> int:
        """Kill the processes, then remove the session directories, an earlier node process left (killed before
        its cleanup)."""
        await asyncio.to_thread(self._launcher.kill_leftovers)
        if not self.sessions_dir.is_dir():
            return 0
        leftovers = [path for path in self.sessions_dir.iterdir() if path.is_dir()]
        for path in leftovers:
            await asyncio.to_thread(remove_dir, path)
        return len(leftovers)
