"""The common base of harness launchers: what a harness run needs and the adapter contract.

An adapter turns (private directories, gateway endpoint, prompt) into an `Invocation`: the argv of a
non-interactive run, a clean environment (no variable of the parent process leaks in, so no real API key
or proxy setting can), and the config files it wrote into the private HOME. Running the invocation (process
group, timeout, stdin=/dev/null, network isolation) is `lodestar_gateway.node.harnesses.launcher`'s job.
"""

from __future__ import annotations

import json
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lodestar.errors import FailedPreconditionError

REPO_ROOT = Path(__file__).resolve().parents[5]
DEFAULT_BIN_DIR = REPO_ROOT / ".harnesses" / "node_modules" / ".bin"
"""Where `scripts/install-harnesses.sh` (make harnesses) puts the harness binaries."""

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


@dataclass(frozen=True)
class RunDirs:
    """The private directories of one harness run. All three must exist."""

    home: Path
    tmpdir: Path
    workdir: Path

    @classmethod
    def under(cls, root: Path) -> RunDirs:
        """Create `home`, `tmp` and `work` under `root` (which the caller owns and removes)."""
        dirs = cls(home=root / "home", tmpdir=root / "tmp", workdir=root / "work")
        for path in (dirs.home, dirs.tmpdir, dirs.workdir):
            path.mkdir(parents=True, exist_ok=True)
        return dirs


@dataclass(frozen=True)
class GatewayEndpoint:
    """How a harness reaches the gateway: its vendor-API base URL, the session key and the model name."""

    base_url: str
    """http://HOST:PORT, without any API path (each adapter appends /v1, /v1beta... as its client needs)."""
    session_key: str
    model: str

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/")


@dataclass(frozen=True)
class Invocation:
    """One prepared, non-interactive harness run."""

    harness: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    config_files: list[Path] = field(default_factory=list)
    """Files the adapter wrote (into the private HOME), for debugging and tests."""
    reads: tuple[Path, ...] = ()
    """Node files the program needs to see besides the installations every session sees (the host runtime's
    sandbox shows only an allow-list: harnesses/sandbox_root.py), e.g. the command harness's program file."""


class Harness(ABC):
    """A launcher adapter for one harness binary."""

    name: str
    """Registry name: the harness kind (claude_code, codex, qwen_code, pi, gemini_cli, command, ...)."""
    binary_name: str
    """File name of the executable in the bin directory."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir if bin_dir is not None else DEFAULT_BIN_DIR

    @property
    def binary(self) -> Path:
        return self.bin_dir / self.binary_name

    def is_installed(self) -> bool:
        return os.access(self.binary, os.X_OK)

    def require_installed(self) -> Path:
        if not self.is_installed():
            raise FailedPreconditionError(
                f"harness {self.name!r} is not installed (no {self.binary}); run `make harnesses`"
            )
        return self.binary

    @abstractmethod
    def prepare(self, dirs: RunDirs, endpoint: GatewayEndpoint, prompt: str) -> Invocation:
        """Write config files into `dirs.home` and build the argv and environment of one run."""

    def base_env(self, dirs: RunDirs, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean environment: private HOME/TMPDIR/XDG dirs, a PATH with node, no colors, no pager."""
        return clean_env(dirs, self.bin_dir, extra)


def clean_env(dirs: RunDirs, bin_dir: Path = DEFAULT_BIN_DIR, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every process a session runs (harness, verifier): nothing of the parent's."""
    env = {
        "HOME": str(dirs.home),
        "TMPDIR": str(dirs.tmpdir),
        "TMP": str(dirs.tmpdir),
        "TEMP": str(dirs.tmpdir),
        "XDG_CONFIG_HOME": str(dirs.home / ".config"),
        "XDG_CACHE_HOME": str(dirs.home / ".cache"),
        "XDG_DATA_HOME": str(dirs.home / ".local" / "share"),
        "XDG_STATE_HOME": str(dirs.home / ".local" / "state"),
        "PATH": _path_with_node(bin_dir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "FORCE_COLOR": "0",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "SHELL": "/bin/bash",
        "USER": os.environ.get("USER", "root"),
        "NODE_OPTIONS": "--max-old-space-size=2048",
        "NO_UPDATE_NOTIFIER": "1",
        "NPM_CONFIG_UPDATE_NOTIFIER": "false",
    }
    if extra:
        env.update(extra)
    return env


def write_json(path: Path, data: Any) -> Path:
    """Write a config file (creating its directory) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _path_with_node(bin_dir: Path) -> str:
    parts: list[str] = [str(bin_dir)]
    node = shutil.which("node")
    if node:
        parts.append(str(Path(node).resolve().parent))
    parts.extend(SYSTEM_PATH.split(":"))
    return ":".join(dict.fromkeys(parts))


def toml_string(value: str) -> str:
    """A TOML basic string (JSON string escapes are valid TOML basic-string escapes)."""
    return json.dumps(value)
