"""The `host` runtime: the session's processes run on the node's host, each in a mount namespace of its
own in which the session's private root is bind-mounted onto the fixed root (default
`/tmp/lodestar-session`), and harnesses in a loopback-only network namespace that reaches only this
gateway (`harnesses/launcher.py`, `harnesses/netns.py`).

Each session attempt gets `<sessions_dir>/<name>/{home,tmp,work}` with the task's files in `work`. When
mount namespaces are unavailable, sessions see their real paths (`fixed_paths` False, logged once by the
launcher's probe, and reported in the result's details). Limits of the RuntimeSpec are not applied here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodestar.v1 import rollout_pb2
from services.gateway.node.harnesses import HarnessResult, Invocation, Launcher, RunDirs
from services.gateway.node.harnesses.base import clean_env
from services.gateway.node.runtimes.base import DEFAULT_FIXED_ROOT, remove_dir, stage_dirs, translate_paths


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

    @property
    def binds(self) -> list[tuple[Path, Path]]:
        """Bind mounts every process of the session runs under."""
        return [(self.root, self.visible.home.parent)] if self.fixed_paths else []

    def translate(self, invocation: Invocation) -> Invocation:
        if not self.fixed_paths:
            return invocation
        return translate_paths(invocation, self.root, self.visible.home.parent)

    async def run_harness(self, invocation: Invocation, gateway_url: str, timeout_s: float) -> HarnessResult:
        return await self.launcher.run(invocation, gateway_url, timeout_s, binds=self.binds)

    async def run_process(self, argv: list[str], env: Mapping[str, str], timeout_s: float) -> HarnessResult:
        invocation = Invocation("verifier", argv, clean_env(self.visible, extra=env), self.visible.workdir)
        return await self.launcher.run(invocation, None, timeout_s, binds=self.binds)

    def details(self) -> dict[str, Any]:
        """As before runtimes had kinds: a result without `kind` in its runtime details ran on the host."""
        return {"fixed_paths": self.fixed_paths}

    async def cleanup(self) -> None:
        """Remove every file of the session (its processes are gone: the launcher kills them)."""
        await asyncio.to_thread(remove_dir, self.root)


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
        real = await asyncio.to_thread(stage_dirs, root, files)
        visible = RunDirs(self.fixed_root / "home", self.fixed_root / "tmp", self.fixed_root / "work")
        return HostRuntime(root, real, visible if fixed else real, fixed, self._launcher)

    async def remove_leftovers(self) -> int:
        """Remove session directories left by an earlier node process (killed before its cleanup)."""
        if not self.sessions_dir.is_dir():
            return 0
        leftovers = [path for path in self.sessions_dir.iterdir() if path.is_dir()]
        for path in leftovers:
            await asyncio.to_thread(remove_dir, path)
        return len(leftovers)
