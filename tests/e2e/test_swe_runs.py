"""Repository tasks end to end on the host runtime: scripted inference, the rollout service, a gateway node (all
processes), the example agent through the `command` harness, swe-mini's repositories and the `swe` verifier.

The scripted model makes one shell call that fixes slugify's bug when the workspace holds slugify and does
nothing elsewhere, then says "done": slugify's sessions score 1.0 and roman's 0.0, each with its per-test
outcomes in `verifier_details`. Then `lodestar eval examples/swe-mini --runtime host` on the same stack
scores the whole set (one fix out of ten: pass@1 0.1).
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
from tests.e2e.node_stack import AGENT, REPO, NodeStack
from tests.e2e.swe_support import FIX_SLUGIFY

pytestmark = pytest.mark.slow
SWE_MINI = REPO / "examples" / "swe-mini"
SCRIPT = {"replies": [{"tool_calls": [{"name": "shell", "arguments": {"command": FIX_SLUGIFY}}]}, {"text": "done"}]}
SLUGIFY_F2P = "tests/test_slugify.py::test_collapses_and_strips_dashes"
SLUGIFY_P2P = "tests/test_slugify.py::test_simple_word"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[NodeStack]:
    root = tmp_path_factory.mktemp("swe-e2e")
    with NodeStack.start(root, etcd_endpoint, f"/e2e/{uuid.uuid4().hex}/", script=SCRIPT, nodes=1) as started:
        yield started


def _swe_mini(*task_ids: str) -> list[dict[str, Any]]:
    tasks = [json.loads(line) for line in (SWE_MINI / "tasks.jsonl").read_text().splitlines()]
    chosen = [task for task in tasks if task["task_id"] in task_ids]
    for task in chosen:
        task["repository"]["source"] = str(SWE_MINI / task["repository"]["source"])
    return chosen


def test_fixed_and_unfixed_repositories_score_one_and_zero(stack: NodeStack):
    spec = {
        "name": "swe-mini-e2e",
        "tasks": _swe_mini("swe-mini-slugify", "swe-mini-roman"),
        "groupSize": 2,
        "harness": {"kind": "command", "command": AGENT, "model": "lodestar-tiny"},
        "verifier": {"kind": "swe", "config": {"timeout_s": 60}},
        "maxAttempts": 2,
        "sessionTimeout": "120s",
        "agentTimeout": "60s",
    }
    run_id = stack.create_run(spec)

    run = stack.wait_run(run_id)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_total, run.sessions_succeeded, run.sessions_failed) == (4, 4, 0)
    groups = {group.task_id: group for group in stack.groups(run_id)}
    for session in groups["swe-mini-slugify"].sessions:
        assert session.outcome == rollout_pb2.SESSION_OUTCOME_SCORED
        assert session.reward == 1.0, session.verifier_details
        details = session.verifier_details
        assert details["kind"] == "swe"
        assert details["resolved"] is True
        assert dict(details["fail_to_pass"]) == {SLUGIFY_F2P: "passed"}
        assert dict(details["pass_to_pass"]) == {SLUGIFY_P2P: "passed"}
        assert session.calls[0].completion.tool_calls[0].name == "shell"
    for session in groups["swe-mini-roman"].sessions:
        assert session.outcome == rollout_pb2.SESSION_OUTCOME_SCORED
        assert session.reward == 0.0
        details = session.verifier_details
        assert details["resolved"] is False
        assert dict(details["fail_to_pass"]) == {"tests/test_roman.py::test_subtractive_numerals": "failed"}
        assert dict(details["pass_to_pass"]) == {"tests/test_roman.py::test_additive_numerals": "passed"}
    assert run.reward_mean == pytest.approx(0.5)


def test_lodestar_eval_on_the_swe_mini_directory(stack: NodeStack):
    done = subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", "eval", str(SWE_MINI), "--harness", "command", "--samples", "1",
         "--runtime", "host", "--rollout", stack.rollout.address, "--timeout-s", "240", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

    (result,) = json.loads(done.stdout)

    assert (result["harness"], result["tasks"], result["samples"]) == ("command", 10, 10)
    assert result["unscored_tasks"] == 0
    assert result["passed"] == 1
    assert result["pass_at_1"] == pytest.approx(0.1)
    run = stack.get_run(result["run_id"])
    assert (run.sessions_total, run.sessions_failed) == (10, 0)
