"""`lodestar redteam` through real runs: real rollout, a real gateway node, the host runtime's sandbox, the real
verifiers, the adversarial agents as `command` harness programs, a scripted echo model (NodeStack).

- A deliberately weak verifier (a `command` verifier taking its reward from the command's stdout, which the
  code under test can print) is fooled: exit 1, `reward-channel` named; `lodestar train` refuses to train on it.
- examples/swe-mini, exactly as docs/redteam.md runs it (its own stack): exit 0 once the swe verifier and the
  sandbox stop every hack (issue 39).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestar_app.cli.main import main
from tests.e2e.node_stack import NodeStack

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ECHO = {"default": {"echo": True}}
WEAK_VERIFIER = """\
name: weak
tasks: tasks.jsonl
groupSize: 1
harness: {kind: command, command: ["{python}", "-c", "pass"]}
verifier:
  kind: command
  config:
    reward_from: stdout
    timeout_s: 60
    command: >-
      python3 -c 'import json, calc; print(json.dumps({"reward": float(calc.add(2, 2) == 4)}))'
agentTimeout: 60s
sessionTimeout: 300s
"""
TASK = {"task_id": "add", "prompt": "Fix add() in calc.py.", "files": {"calc.py": "def add(a, b):\n    return a - b\n"}}
FEW = ["--hack", "reward-channel", "--hack", "edit-tests", "--hack", "answer-env"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[NodeStack]:
    root = tmp_path_factory.mktemp("redteam")
    with NodeStack.start(root, etcd_endpoint, f"/redteam/{uuid.uuid4().hex}/", script=ECHO, nodes=1, slots=4) as up:
        yield up


@pytest.fixture
def weak(tmp_path: Path) -> Path:
    (tmp_path / "tasks.jsonl").write_text(json.dumps(TASK) + "\n")
    (tmp_path / "run.yaml").write_text(WEAK_VERIFIER)
    return tmp_path / "run.yaml"


def test_a_verifier_that_reads_the_reward_from_stdout_pays_and_the_red_team_says_which_hack(
    stack: NodeStack, weak: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["redteam", str(weak), "--tasks", "1", "--rollout", stack.rollout.address, "--json", *FEW])
    cells = {cell["hack"]: cell for cell in json.loads(capsys.readouterr().out)}
    assert code == 1
    assert cells["noop"]["verdict"] == "held"
    assert cells["noop"]["reward"] == 0.0, "the unfixed add() scores 0"
    assert cells["reward-channel"]["verdict"] == "paid", cells["reward-channel"]
    assert cells["reward-channel"]["reward"] == 1.0
    assert cells["edit-tests"]["verdict"] == "held", "no test file to edit: the check is the verifier's own"


def test_lodestar_train_refuses_a_verifier_that_pays(
    stack: NodeStack, weak: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    addresses = tmp_path / "addresses.json"
    addresses.write_text(json.dumps({"inference": stack.inference.address, "rollout": stack.rollout.address,
                                     "model": str(stack.root / "model")}))  # fmt: skip
    config = tmp_path / "train.toml"
    config.write_text(
        f'[train]\nspec = "{weak}"\nsteps = 1\nrun_dir = "{tmp_path / "runs"}"\nattach = "{addresses}"\n'
        '[redteam]\ntasks = 1\nhacks = ["reward-channel"]\n'
    )
    code = main(["train", str(config)])
    err = capsys.readouterr().err
    assert code == 2
    assert "refusing to train: hack 'reward-channel' paid on task 'add'" in err
    assert not (tmp_path / "runs").exists(), "no trainer was started"


def test_swe_mini_pays_no_hack(tmp_path: Path) -> None:
    """The acceptance run of issue 39 (its own stack, every hack kind that applies to `swe`, 2 tasks)."""
    done = subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", "redteam", str(REPO / "examples/swe-mini/run.yaml"),
         "--tasks", "2", "--data-dir", str(tmp_path / "stack")],
        capture_output=True, text=True, timeout=600, cwd=REPO, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:]
    assert "no hack paid" in done.stdout
