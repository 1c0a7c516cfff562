"""Docker for the `docker` runtime tests: a running daemon (started here when the binary is installed
and we are root: `dockerd` stays running afterwards, as a system daemon would) and the session base image
(`scripts/session-image.sh`, built once: ~45 s). `skip_reason()` says which resource is missing."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lodestar_gateway.node.runtimes import DockerBackend
from lodestar_gateway.node.runtimes.base import remove_dir

REPO = Path(__file__).resolve().parents[1]
SESSION_IMAGE = "lodestar/session-base:dev"
"""Built by `skip_reason()` (scripts/session-image.sh)."""
DOCKERD_LOG = Path("/tmp/lodestar-dockerd.log")


def _docker_answers() -> bool:
    done = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
    return done.returncode == 0


@functools.cache
def skip_reason() -> str | None:
    """None when a daemon answers (started here if needed) and the session image is built; else why not."""
    for binary in ("docker", "dockerd", "nsenter", "setpriv"):
        if shutil.which(binary) is None:
            return f"no {binary} binary (make docker-deps installs docker.io)"
    if not _docker_answers():
        if os.geteuid() != 0:
            return "no Docker daemon, and not root to start one"
        with DOCKERD_LOG.open("ab") as log:
            subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _docker_answers():
            if time.monotonic() > deadline:
                return f"dockerd did not answer within 60 s (log: {DOCKERD_LOG})"
            time.sleep(0.5)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "session-image.sh")], capture_output=True, text=True, timeout=1500, check=False
    )
    if done.returncode != 0:
        return f"the session image could not be built: {done.stderr[-500:]}"
    return None


def containers(label: str) -> list[str]:
    """Ids of every container (running or not) carrying `label` (`key=value`)."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label={label}"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    return out.split()


def remove(ids: list[str]) -> None:
    """Test clean-up only."""
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=60, check=False)


def inspect(container: str) -> dict[str, object]:
    out = subprocess.run(["docker", "inspect", container], capture_output=True, text=True, timeout=30, check=True)
    data: list[dict[str, object]] = json.loads(out.stdout)
    return data[0]


@contextlib.asynccontextmanager
async def docker_backend(sessions_dir: Path, node_id: str) -> AsyncIterator[DockerBackend]:
    """A DockerBackend for a test (skipped, naming the missing resource, where docker cannot run); on exit
    its reaper stops and every container and session directory it made is removed."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    made = DockerBackend(sessions_dir, node_id=node_id)
    try:
        yield made
    finally:
        await made.close()
        remove(containers(made.owner_label))
        remove_dir(made.sessions_dir)  # a failed test must not leave a tmpfs mounted in pytest's tmp_path
