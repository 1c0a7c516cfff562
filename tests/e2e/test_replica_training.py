"""A training run over two inference replicas: `lodestar train` on the quickstart with `inference_replicas = 2`
(two `lodestar inference serve` processes, the tiny model) for 3 steps, as a subprocess. The gateway sends
every call of a session to one replica (each call's record names it), sessions spread over both, and the
trainer's pushes reach both: each replica served calls under a policy version newer than 0."""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from lodestar.v1 import rollout_pb2
from tests.e2e.train_cli import run_train

pytestmark = [pytest.mark.slow]
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
STEPS = 3
TIMEOUT_S = 900


def _config(tmp_path: Path) -> Path:
    text = (QUICKSTART / "quickstart.toml").read_text()
    text = text.replace('spec = "run.yaml"', f'spec = "{QUICKSTART / "run.yaml"}"')
    text = re.sub(r"(?m)^steps = \d+", f'steps = {STEPS}\ninference_replicas = 2\nattach = "never"', text)
    text = re.sub(r'(?m)^run_dir = "[^"]*"', f'run_dir = "{tmp_path / "runs"}"', text)
    text = re.sub(r'(?m)^data_dir = "[^"]*"', f'data_dir = "{tmp_path / "stack"}"', text)
    config = tmp_path / "replicas.toml"
    config.write_text(text)
    return config


@pytest.mark.timeout(TIMEOUT_S + 180)
def test_a_run_trains_over_two_replicas_with_session_affinity(tmp_path: Path) -> None:
    returncode, output = run_train(_config(tmp_path), tmp_path, TIMEOUT_S)
    assert returncode == 0, output[-6000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    replicas_of: dict[str, set[str]] = defaultdict(set)
    versions_of: dict[str, set[int]] = defaultdict(set)
    with sqlite3.connect(tmp_path / "stack" / "rollout.sqlite") as db:
        rows = db.execute("SELECT session_id, result FROM results WHERE session_id LIKE ?", (f"{run_dir.name}-%",))
        for session_id, blob in rows:
            for call in rollout_pb2.SessionResult.FromString(blob).calls:
                replicas_of[session_id].add(call.inference_replica)
                versions_of[call.inference_replica].add(call.policy_version)
    assert len(replicas_of) >= 16, "the run sampled sessions"
    assert all(len(names) == 1 for names in replicas_of.values()), "a session's calls changed replica"
    assert set(versions_of) == {"inference", "inference-2"}, versions_of.keys()
    for replica, versions in versions_of.items():
        assert max(versions) >= 1, f"{replica} never served a pushed policy version: {sorted(versions)}"
    assert (tmp_path / "stack" / "logs" / "inference-2.log").stat().st_size > 0
