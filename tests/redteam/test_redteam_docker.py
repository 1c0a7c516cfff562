"""`lodestar redteam examples/swe-mini --runtime docker` (marker `docker`, `make test-docker`): every hack kind
that applies to `swe`, each session a container of the swe-mini task image, exit 0 when none pays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lodestar_app.cli.images import build_task_image
from tests.docker_support import SESSION_IMAGE, skip_reason

pytestmark = [pytest.mark.docker, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TASK_IMAGE = "lodestar/task-swe-mini:dev"


@pytest.fixture(scope="module")
def task_image() -> str:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return build_task_image(REPO / "examples" / "swe-mini", base=SESSION_IMAGE, tag=TASK_IMAGE, log=False)


def test_swe_mini_pays_no_hack_in_containers(task_image: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", "redteam", str(REPO / "examples/swe-mini"), "--tasks", "1",
         "--runtime", "docker", "--image", task_image, "--data-dir", str(tmp_path / "stack")],
        capture_output=True, text=True, timeout=900, cwd=REPO, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "no hack paid" in done.stdout
