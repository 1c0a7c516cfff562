"""The Python harnesses (mini-swe-agent, the OpenHands SDK agent) as `HarnessSpec.kind` on the real stack
(processes): scripted inference, the rollout service, two gateway nodes, its own etcd. 2 tasks x 2 samples
per harness: the harness writes a file with its shell tool in the session's fixed workspace, the command
verifier scores it (one task expects another content: reward 0), and the final answer is the text of the
last completion. tests/e2e/test_node_runs.py does the same for the npm harnesses.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import make_harness
from lodestar_gateway.node.harnesses.mini_swe_agent import SUBMIT_MARKER
from tests.conftest import EtcdServer
from tests.e2e.node_stack import NodeStack, out_txt_spec

pytestmark = [pytest.mark.slow, pytest.mark.harness]
WRITE = "echo hi > out.txt"
SCRIPTS: dict[str, dict[str, Any]] = {
    "mini_swe_agent": {
        "replies": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": WRITE}}]},
            {"text": "done", "tool_calls": [{"name": "bash", "arguments": {"command": f"echo {SUBMIT_MARKER}"}}]},
        ]
    },
    "openhands": {
        "replies": [
            {"tool_calls": [{"name": "terminal", "arguments": {"command": WRITE, "summary": "Write it"}}]},
            {"text": "done"},
        ]
    },
}
BINARIES = {"mini_swe_agent": "mini_swe_agent", "openhands": "openhands"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeStack]:
    etcd = EtcdServer(tmp_path_factory.mktemp("python-harness-etcd"))
    try:
        root = tmp_path_factory.mktemp("python-harness-e2e")
        with NodeStack.start(root, etcd.endpoint, f"/e2e/{uuid.uuid4().hex}/", script={}) as started:
            yield started
    finally:
        etcd.stop()


@pytest.mark.parametrize("kind", list(SCRIPTS))
def test_python_harness_run_two_tasks_by_two(stack: NodeStack, kind: str) -> None:
    harness = make_harness(BINARIES[kind])
    if not harness.is_installed():
        target = "make harnesses-openhands" if kind == "openhands" else "make harnesses"
        pytest.skip(f"{harness.binary} is not installed (run `{target}`)")
    stack.set_script(SCRIPTS[kind])
    shell_tool = SCRIPTS[kind]["replies"][0]["tool_calls"][0]["name"]
    spec = out_txt_spec(kind, ["hi", "bye"], group_size=2)
    run_id = stack.create_run(spec, name=f"{kind}.yaml")

    run = stack.wait_run(run_id, timeout=300)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_succeeded, run.infra_failures) == (4, 0), run
    assert run.reward_mean == pytest.approx(0.5)
    groups = stack.groups(run_id)
    assert len(groups) == 2
    for group in groups:
        expected = 0.0 if group.task_id.endswith("-1") else 1.0
        for session in group.sessions:
            assert session.outcome == rollout_pb2.SESSION_OUTCOME_SCORED
            assert session.reward == expected, session.verifier_details
            assert session.final_answer == "done"
            assert len(session.calls) == 2
            assert [call.name for call in session.calls[0].completion.tool_calls] == [shell_tool]
            for call in session.calls:
                assert len(call.completion_logprobs) == len(call.completion_token_ids) > 0
            assert session.verifier_details["runtime"] == {"fixed_paths": True, "network_isolated": True}
