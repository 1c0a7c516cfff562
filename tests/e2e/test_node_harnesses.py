"""End to end with REAL harnesses as `HarnessSpec.kind`: Pi (OpenAI Chat) and Claude Code run by two gateway
nodes against the scripted engine, each doing one round trip through its own shell tool; a `command`
verifier checks the file the tool wrote. Every sample of a task must start from the same prompt tokens
(fixed session paths), although each harness writes its paths into its system prompt.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from lodestar.v1 import rollout_pb2
from services.gateway.node.harnesses import make_harness
from tests.e2e.node_stack import NodeStack

pytestmark = [pytest.mark.harness, pytest.mark.slow]
SCRIPT = {
    "replies": [
        {
            "tool_calls": [
                {"name": ["bash", "Bash"], "arguments": {"command": "echo hi > out.txt", "description": "Write it"}}
            ]
        },
        {"text": "done"},
    ]
}
CHECK = (
    'expected=$(python3 -c \'import json, os; print(json.loads(os.environ["LODESTAR_TASK_METADATA"])["expected"])\'); '
    'test "$(cat out.txt)" = "$expected"'
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[NodeStack]:
    for name in ("pi", "claude-code"):
        harness = make_harness(name)
        if not harness.is_installed():
            pytest.fail(f"{harness.binary} is not installed: run `make harnesses`", pytrace=False)
    prefix = f"/e2e/{uuid.uuid4().hex}/"
    with NodeStack.start(tmp_path_factory.mktemp("harness-e2e"), etcd_endpoint, prefix, script=SCRIPT) as started:
        yield started


@pytest.mark.parametrize("kind", ["pi", "claude_code"])
def test_real_harness_run_three_tasks_by_four(stack: NodeStack, kind: str):
    tasks = [
        {"taskId": f"{kind}-{i}", "prompt": "Write hi into out.txt with the shell tool.", "metadata": {"expected": e}}
        for i, e in enumerate(["hi", "hi", "bye"])
    ]
    spec = {
        "name": kind,
        "tasks": tasks,
        "groupSize": 4,
        "harness": {"kind": kind, "model": "lodestar-tiny"},
        "verifier": {"kind": "command", "config": {"command": CHECK, "timeout_s": 30}},
        "earlyStopFraction": 1.0,
        "maxAttempts": 2,
        "sessionTimeout": "300s",
        "agentTimeout": "240s",
    }
    run_id = stack.create_run(spec, name=f"{kind}.yaml")

    run = stack.wait_run(run_id, timeout=300)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_succeeded, run.infra_failures) == (12, 0), run
    assert run.reward_mean == pytest.approx(2 / 3)
    groups = stack.groups(run_id)
    assert len(groups) == 3
    for group in groups:
        expected = 0.0 if group.task_id.endswith("-2") else 1.0
        first_prompts = set()
        for session in group.sessions:
            assert session.outcome == rollout_pb2.SESSION_OUTCOME_SCORED
            assert session.reward == expected, session.verifier_details
            assert "done" in session.final_answer
            assert len(session.calls) == 2
            assert session.calls[0].completion.tool_calls[0].name in {"bash", "Bash"}
            for call in session.calls:
                assert len(call.completion_logprobs) == len(call.completion_token_ids) > 0
            assert session.verifier_details["runtime"] == {"fixed_paths": True, "network_isolated": True}
            assert "/tmp/lodestar-session/work" in session.calls[0].original_request_json, "its prompt names the path"
            first_prompts.add(tuple(session.calls[0].prompt_token_ids))
        assert len(first_prompts) == 1, f"{kind}: samples of one task start from different prompt tokens"
