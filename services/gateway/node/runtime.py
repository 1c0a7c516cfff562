"""A session's runtime: fresh private directories, seen by every process of the session at fixed paths.

Each session attempt gets `<sessions_dir>/<name>/{home,tmp,work}` with the task's files in `work`. Harnesses
write their HOME, TMPDIR and working directory into their system prompts, so per-session paths would make
the samples of one task diverge after a few hundred tokens. When mount namespaces work (as root, or in a
user namespace), the private root is bind-mounted onto one fixed path (default `/tmp/lodestar-session`) in
a mount namespace of the session's own: every session sees HOME=/tmp/lodestar-session/home,
TMPDIR=/tmp/lodestar-session/tmp and works in /tmp/lodestar-session/work, and the prompt prefix of a group
is identical. When they do not, sessions see their real paths (`fixed_paths` is False, logged once by the
launcher's probe, and reported in the result's details).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from lodestar.errors import InvalidArgumentError
from services.gateway.node.harnesses import Invocation, Launcher, RunDirs

DEFAULT_FIXED_ROOT = Path("/tmp/lodestar-session")


@dataclass(frozen=True)
class SessionRuntime:
    """The directories of one session attempt (see the module docstring)."""

    root: Path
    """The real private root (removed by `cleanup`)."""
    real: RunDirs
    """The real directories, as the node sees them."""
    visible: RunDirs
    """The directories as the session's processes see them (fixed paths when `fixed_paths`)."""
    fixed_paths: bool

    @property
    def binds(self) -> list[tuple[Path, Path]]:
        """Bind mounts every process of the session runs under."""
        return [(self.root, self.visible.home.parent)] if self.fixed_paths else []

    def translate(self, invocation: Invocation) -> Invocation:
        """An invocation prepared on the real directories, rewritten to the visible ones (argv, env and the
        config files the adapter wrote)."""
        if not self.fixed_paths:
            return invocation
        real, seen = str(self.root), str(self.visible.home.parent)
        for path in invocation.config_files:
            text = path.read_text(encoding="utf-8")
            if real in text:
                path.write_text(text.replace(real, seen), encoding="utf-8")
        return replace(
            invocation,
            argv=[arg.replace(real, seen) for arg in invocation.argv],
            env={key: value.replace(real, seen) for key, value in invocation.env.items()},
            cwd=Path(str(invocation.cwd).replace(real, seen)),
        )

    async def cleanup(self) -> None:
        """Remove every file of the session (its processes must be gone)."""
        await asyncio.to_thread(shutil.rmtree, self.root, True)


class RuntimeFactory:
    """Creates session runtimes under one directory of the node."""

    def __init__(self, sessions_dir: Path, launcher: Launcher, *, fixed_root: Path = DEFAULT_FIXED_ROOT) -> None:
        self.sessions_dir = sessions_dir
        self.fixed_root = fixed_root
        self._launcher = launcher

    async def create(self, name: str, files: Mapping[str, str]) -> SessionRuntime:
        """Fresh directories for `name` (any leftover of that name is removed first) with `files` written
        into the workspace. InvalidArgumentError for a file path outside the workspace."""
        paths = {_relative(path): content for path, content in files.items()}
        root = self.sessions_dir / name
        fixed = await self._launcher.mounts.available()
        await asyncio.to_thread(_fresh, root, paths)
        real = RunDirs(home=root / "home", tmpdir=root / "tmp", workdir=root / "work")
        visible = RunDirs(self.fixed_root / "home", self.fixed_root / "tmp", self.fixed_root / "work")
        return SessionRuntime(root=root, real=real, visible=visible if fixed else real, fixed_paths=fixed)

    async def remove_leftovers(self) -> int:
        """Remove session directories left by an earlier node process (killed before its cleanup)."""
        if not self.sessions_dir.is_dir():
            return 0
        leftovers = [path for path in self.sessions_dir.iterdir() if path.is_dir()]
        for path in leftovers:
            await asyncio.to_thread(shutil.rmtree, path, True)
        return len(leftovers)


def _relative(path: str) -> PurePosixPath:
    relative = PurePosixPath(path)
    if not path or relative.is_absolute() or ".." in relative.parts:
        raise InvalidArgumentError(f"task file path {path!r} must be relative and stay inside the workspace")
    return relative


def _fresh(root: Path, files: Mapping[PurePosixPath, str]) -> None:
    shutil.rmtree(root, ignore_errors=True)
    dirs = RunDirs.under(root)
    for relative, content in files.items():
        target = dirs.workdir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
