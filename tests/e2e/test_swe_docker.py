"""swe-mini on the `docker` runtime through the real stack (marker `docker`): scripted inference, rollout, one
gateway node, the task image of `lodestar images build-task examples/swe-mini`, and real harnesses (the
node's pinned installs, mounted into each session container) editing the repository inside their container.
The scripted model makes one bash call that fixes slugify's bug where the workspace holds slugify, then
one that prints mini-swe-agent's submit marker, then says "done".

- 3 tasks x 2 with Claude Code, and with mini-swe-agent: slugify's sessions score 1.0, roman's and
  stats' 0.0, per-test details in each result; no session container is left afterwards.
- `lodestar eval examples/swe-mini --harness claude_code --runtime docker` prints its table (pass@1 0.100).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_app.cli.images import build_task_image
from lodestar_gateway.node.harnesses import make_harness
from lodestar_gateway.node.harnesses.mini_swe_agent import SUBMIT_MARKER
from tests.docker_support import SESSION_IMAGE, containers, remove, skip_reason
from tests.e2e.node_stack import REPO, NodeStack
from tests.e2e.swe_support import FIX_SLUGIFY

pytestmark = [pytest.mark.docker, pytest.mark.harness, pytest.mark.slow]
SWE_MINI = REPO / "examples" / "swe-mini"
TASK_IMAGE = "lodestar/task-swe-mini:dev"
SUBMIT = f"echo {SUBMIT_MARKER}"
SCRIPT = {  # Claude Code: fix, submit command (a no-op for it), "done"; mini-swe-agent: fix, submit (its end)
    "replies": [
        {"tool_calls": [{"name": ["Bash", "bash"], "arguments": {"command": FIX_SLUGIFY, "description": "Fix it"}}]},
        {"tool_calls": [{"name": ["Bash", "bash"], "arguments": {"command": SUBMIT, "description": "Submit"}}]},
    ],
    "default": {"text": "done"},
}
HARNESSES = {"claude_code": ("claude_code", "Bash"), "mini_swe_agent": ("mini_swe_agent", "bash")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[NodeStack]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    for launcher, _ in HARNESSES.values():
        if not make_harness(launcher).is_installed():
            pytest.fail(f"{launcher} is not installed: run `make harnesses`", pytrace=False)
    build_task_image(SWE_MINI, base=SESSION_IMAGE, tag=TASK_IMAGE, log=False)
    root = tmp_path_factory.mktemp("swe-docker-e2e")
    with NodeStack.start(root, etcd_endpoint, f"/e2e-swe/{uuid.uuid4().hex}/", script=SCRIPT, nodes=1) as started:
        yield started
    remove(containers(_owner(started)))


def _owner(stack: NodeStack) -> str:
    return f"lodestar.sessions-dir={(stack.root / 'node-0' / 'sessions').resolve()}"


def _tasks(*task_ids: str) -> list[dict[str, Any]]:
    tasks = [json.loads(line) for line in (SWE_MINI / "tasks.jsonl").read_text().splitlines()]
    chosen = [task for task in tasks if task["task_id"] in task_ids]
    for task in chosen:
        task["repository"]["source"] = str(SWE_MINI / task["repository"]["source"])
    return chosen


@pytest.mark.parametrize("kind", list(HARNESSES))
def test_a_harness_fixes_a_repository_in_its_container(stack: NodeStack, kind: str):
    spec = {
        "name": f"swe-mini-docker-{kind}",
        "tasks": _tasks("swe-mini-slugify", "swe-mini-roman", "swe-mini-stats"),
        "groupSize": 2,
        "harness": {"kind": kind, "model": "lodestar-tiny"},
        "verifier": {"kind": "swe", "config": {"timeout_s": 120}},
        "maxAttempts": 2,
        "sessionTimeout": "300s",
        "agentTimeout": "240s",
        "runtime": {"kind": "docker", "image": TASK_IMAGE, "cpus": 1, "memoryBytes": 2 << 30},
    }
    run_id = stack.create_run(spec)

    run = stack.wait_run(run_id, timeout=600)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_total, run.sessions_succeeded, run.sessions_failed) == (6, 6, 0)
    groups = {group.task_id: group for group in stack.groups(run_id)}
    for task_id, group in groups.items():
        for session in group.sessions:
            details = session.verifier_details
            assert session.outcome == rollout_pb2.SESSION_OUTCOME_SCORED, session.error
            assert details["runtime"]["kind"] == "docker"
            assert details["runtime"]["image"] == TASK_IMAGE
            tools = {call.completion.tool_calls[0].name for call in session.calls if call.completion.tool_calls}
            assert tools == {HARNESSES[kind][1]}
            f2p, p2p = dict(details["fail_to_pass"]), dict(details["pass_to_pass"])
            assert set(p2p.values()) == {"passed"}, details["output_tail"]
            expected = "passed" if task_id == "swe-mini-slugify" else "failed"
            assert set(f2p.values()) == {expected}, details["output_tail"]
            assert session.reward == (1.0 if task_id == "swe-mini-slugify" else 0.0)
    assert containers(_owner(stack)) == [], "every session container is removed"


def test_lodestar_eval_swe_mini_with_claude_code_on_docker(stack: NodeStack):
    done = subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", "eval", str(SWE_MINI), "--harness", "claude_code",
         "--runtime", "docker", "--samples", "1", "--rollout", stack.rollout.address, "--timeout-s", "900"],
        capture_output=True, text=True, timeout=960, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    row = next(line for line in done.stdout.splitlines() if "claude_code" in line)
    assert "0.100" in row, done.stdout  # pass@1: one fix out of ten
    assert containers(_owner(stack)) == []
