"""The node lifecycle against a RolloutService stand-in: real gateway node, real scripted inference, real
etcd membership, the example agent (official openai SDK) as a `command` harness, real verifier processes.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
import structlog.testing

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import gateway_pb2, rollout_pb2
from lodestar_gateway.node.lifecycle import LOG_TAIL_CHARS
from lodestar_gateway.server import GatewayNode
from lodestar_gateway.settings import GatewaySettings
from tests.gateway.node.conftest import (
    AGENT,
    HANG_AGENT,
    NodeFactory,
    kill_pids,
    read_pids,
    sessions_dir,
    wait_dead,
)
from tests.gateway.node.standin import RolloutStandIn, assignment
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TOOL_SCRIPT = {
    "replies": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi > out.txt"}}]},
        {"text": "done"},
    ]
}
CHECK_FILE = {"kind": "command", "config": {"command": 'test "$(cat out.txt)" = hi', "timeout_s": 30}}
SCORED = rollout_pb2.SESSION_OUTCOME_SCORED
INFRA = rollout_pb2.SESSION_OUTCOME_INFRA_FAILED


def test_sessions_pass_every_stage_and_report_scored_results(node_factory: NodeFactory, standin: RolloutStandIn):
    stack = node_factory(TOOL_SCRIPT, slots=1, ready_buffer=2)
    ids = [f"s{i}" for i in range(3)]
    standin.offer(*(assignment(sid, command=AGENT, verifier=CHECK_FILE) for sid in ids))
    status = stack.stub().GetNodeStatus(gateway_pb2.GetNodeStatusRequest(), timeout=5)
    assert status.capacity == 1

    results = standin.wait_results(3, timeout=90)

    for result in results:
        assert result.outcome == SCORED, standin.describe(result)
        assert result.reward == 1.0
        assert result.node_id == stack.node.node_id
        assert result.final_answer == "done"
        assert len(result.calls) == 2
        for call in result.calls:
            assert call.prompt_token_ids
            assert call.completion_token_ids
            assert len(call.completion_logprobs) == len(call.completion_token_ids)
        assert result.calls[0].completion.tool_calls[0].name == "shell"
        assert result.exit_code == 0
        assert "done" in result.stdout_tail
        assert result.verifier_details["exit_code"] == 0
        assert result.verifier_details["runtime"]["fixed_paths"] is True
        assert result.agent_duration.ToNanoseconds() > 0
        assert result.session_duration.ToNanoseconds() > 0
    # One run slot: the later sessions waited in the READY buffer, and that time is reported.
    assert max(r.ready_duration.ToNanoseconds() for r in results) > 0.3e9
    # Never more than slots + ready_buffer held before POST; every attempt reported with its stage.
    for request in standin.acquires:
        busy = sum(1 for p in request.in_flight if p.stage != rollout_pb2.SESSION_STAGE_POST)
        assert request.free_slots + busy <= 3
        assert request.node_id == stack.node.node_id
        assert request.lease_id > 0
    waited = [sid for sid in ids if rollout_pb2.SESSION_STAGE_READY in standin.stages_seen(sid)]
    assert waited, [standin.stages_seen(sid) for sid in ids]
    for sid in ids:
        stages = standin.stages_seen(sid)
        assert stages == sorted(stages), stages
    assert not any(sessions_dir(stack).iterdir()), "every workspace is removed"
    standin.wait_for(lambda: not standin.acquires[-1].in_flight, 5, "an empty in_flight report")
    status = stack.stub().GetNodeStatus(gateway_pb2.GetNodeStatusRequest(), timeout=5)
    assert dict(status.stage_counts) == {"INIT": 0, "READY": 0, "RUN": 0, "POST": 0}


def test_same_task_same_first_prompt_ids_with_fixed_paths(node_factory: NodeFactory, standin: RolloutStandIn):
    node_factory({"replies": [{"text": "done"}]})
    standin.offer(*(assignment(sid, command=AGENT) for sid in ("a", "b")))
    first, second = (result.calls[0] for result in standin.wait_results(2))
    assert "/tmp/lodestar-session/work" in first.messages[0].content[0].text.text
    assert list(first.prompt_token_ids) == list(second.prompt_token_ids)


def test_without_mount_namespaces_paths_differ_and_say_so(node_factory: NodeFactory, standin: RolloutStandIn):
    """The weaker isolation (host_sandbox = namespaces) without mount namespaces: real, differing paths."""
    node_factory({"replies": [{"text": "done"}]}, mount_namespaces=False, host_sandbox="namespaces")
    standin.offer(*(assignment(sid, command=AGENT) for sid in ("a", "b")))
    results = standin.wait_results(2)
    first, second = (result.calls[0] for result in results)
    assert list(first.prompt_token_ids) != list(second.prompt_token_ids)
    assert results[0].verifier_details["runtime"]["fixed_paths"] is False


def test_hanging_harness_times_out_keeps_calls_kills_group_removes_workspace(
    node_factory: NodeFactory, standin: RolloutStandIn, tmp_path: Path
):
    # The weaker isolation: its harness can write the host's PIDFILE, so the kill of its group shows (the
    # sandbox's PID namespace ends every process by construction: tests/gateway/node/test_sandbox.py).
    stack = node_factory({"replies": [{"text": "first answer"}]}, host_sandbox="namespaces")
    pidfile = tmp_path / "pids"
    verifier = {"kind": "command", "config": {"score": "echo 0.25 > $LODESTAR_REWARD_FILE"}}
    standin.offer(
        assignment("hang", command=HANG_AGENT, verifier=verifier, agent_timeout_s=6, env={"PIDFILE": str(pidfile)})
    )
    started = time.monotonic()
    try:
        (result,) = standin.wait_results(1, timeout=60)
        assert result.outcome == rollout_pb2.SESSION_OUTCOME_TIMED_OUT, standin.describe(result)
        assert result.reward == 0.25, "a timed-out session is scored by the verifier"
        assert len(result.calls) == 1
        assert result.final_answer == "first answer"
        assert result.exit_code == -1
        assert "time limit" in result.error
        assert 6.0 <= result.agent_duration.ToNanoseconds() / 1e9 < 12.0
        assert time.monotonic() - started < 45
        pids = read_pids(pidfile)
        assert len(pids) == 2
        assert wait_dead(pids), "harness and its background child are killed"
        assert not any(sessions_dir(stack).iterdir())
    finally:
        kill_pids(read_pids(pidfile))


def test_silent_failures_are_infra_failures(node_factory: NodeFactory, standin: RolloutStandIn):
    # Replies in call order: the first call is answered, every later one fails before its first token.
    script = {"select": "sequence", "replies": [{"text": "ok"}], "default": {"text": "no", "fail_after_tokens": 0}}
    node_factory(script)
    gave_up = "import sys; print('x' * 3000 + 'last words'); print('gave up: no credentials', file=sys.stderr)"
    with structlog.testing.capture_logs() as logs:
        standin.offer(
            assignment("no-call", command=["true"]),
            assignment("died", command=["{python}", "-c", gave_up]),
            assignment("unanswered", command=HANG_AGENT, env={"CALLS": "2", "PIDFILE": "/dev/null"}),
        )
        results = {r.session_id: r for r in standin.wait_results(3, timeout=60)}
    for sid in ("no-call", "died"):
        assert results[sid].outcome == INFRA, standin.describe(results[sid])
        assert "without any answered model call" in results[sid].error
        assert results[sid].reward == 0.0
    assert "gave up: no credentials" in results["died"].stderr_tail
    # The node's log line says why the harness gave up (the end of its output, bounded).
    [died] = [e for e in logs if e["event"] == "session finished" and e["session_id"] == "died"]
    assert died["stderr_tail"] == "gave up: no credentials\n"
    assert died["stdout_tail"].endswith("last words\n")
    assert len(died["stdout_tail"]) == LOG_TAIL_CHARS
    unanswered = results["unanswered"]
    assert unanswered.outcome == INFRA, standin.describe(unanswered)
    assert "got no answer" in unanswered.error
    assert len(unanswered.calls) == 1


QUICKSTART_AGENT = str(Path(__file__).resolve().parents[3] / "examples" / "quickstart" / "agent.py")


def test_a_call_the_harness_gave_up_on_is_an_infra_failure(node_factory: NodeFactory, standin: RolloutStandIn):
    """The chaos hour scored a session from its first call while its second still waited for inference: the
    agent gave up on it (its own 120 s timeout) and exited 1, and the node, seeing one answered call and no
    failed one, scored the first call's answer (docs/chaos.md). A call still waiting when the harness finishes
    is a call without an answer."""
    long = {"text": "a long second answer that streams one slow token after another, 0.4 s each"}
    node_factory({"select": "sequence", "replies": [{"text": "OK"}], "default": long, "token_delay_s": 0.4})
    agent = ["{python}", QUICKSTART_AGENT, "--timeout", "3", "{prompt}"]  # 2 tokens answer; 16 do not
    standin.offer(assignment("gave-up", command=agent))
    (result,) = standin.wait_results(1, timeout=60)
    assert result.outcome == INFRA, standin.describe(result)
    assert "got no answer" in result.error  # its caller went away (or, had the node been first: still waiting)
    assert result.reward == 0.0
    assert len(result.calls) == 1


STOPS_READING = """import sys
from openai import OpenAI
client = OpenAI(max_retries=0)
if sys.argv[1] == "answered-first":
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
again = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "OK"}, {"role": "user", "content": "go"}]
stream = client.chat.completions.create(model="m", messages=again, stream=True)
for _, _chunk in zip(range(3), stream):
    pass
stream.close()
"""
"""A harness that stops reading a streamed answer after three chunks and exits 0, as Gemini CLI does when its
loop detection flags the text (a CI run of the Gemini CLI training test failed on it as infrastructure)."""


def test_a_harness_that_stops_reading_a_stream_is_scored(node_factory: NodeFactory, standin: RolloutStandIn):
    """Stopping to read a flowing answer is the harness's choice, never an outage: the session is scored from the
    calls it completed, or with the lowest reward when it completed none (else a policy that loops would turn
    its low rewards into INFRA_FAILED, retried and dropped). The abandoned call leaves no record."""
    long = {"text": "a long answer that streams one token after another, 0.3 s each, for several seconds"}
    node_factory({"replies": [{"text": "OK"}], "default": long, "token_delay_s": 0.3})  # a chat's first answer
    pays = {"kind": "command", "config": {"score": "echo 0.5 > $LODESTAR_REWARD_FILE", "reward_range": [-1, 1]}}
    standin.offer(
        *(
            assignment(case, command=["{python}", "-c", STOPS_READING, case], verifier=pays)
            for case in ("answered-first", "nothing-answered")
        )
    )
    results = {r.session_id: r for r in standin.wait_results(2, timeout=60)}
    first, nothing = results["answered-first"], results["nothing-answered"]
    assert first.outcome == SCORED, standin.describe(first)
    assert first.reward == 0.5, "the verifier scored it"
    assert [call.completion.content[0].text.text for call in first.calls] == ["OK"]
    assert nothing.outcome == SCORED, standin.describe(nothing)
    assert nothing.reward == -1.0, "the low end of the range; the verifier does not run"
    assert "stopped reading all 1 answer(s)" in nothing.verifier_details["agent_failure"]
    assert not nothing.calls


def test_inference_down_is_an_infra_failure(node_factory: NodeFactory, standin: RolloutStandIn):
    node_factory(inference=False)
    standin.offer(assignment("down", command=HANG_AGENT, env={"PIDFILE": "/dev/null"}))
    (result,) = standin.wait_results(1, timeout=60)
    assert result.outcome == INFRA, standin.describe(result)
    assert "model call(s) failed" in result.error
    assert not result.calls


def test_crashing_verifier_is_an_infra_failure(node_factory: NodeFactory, standin: RolloutStandIn):
    node_factory({"replies": [{"text": "done"}]})
    crash = {"kind": "python", "config": {"function": "tests.gateway.node.verifier_functions:crash"}}
    standin.offer(assignment("crash", command=AGENT, verifier=crash))
    (result,) = standin.wait_results(1)
    assert result.outcome == INFRA, standin.describe(result)
    assert "verifier failed" in result.error
    assert "ZeroDivisionError" in result.error
    assert len(result.calls) == 1, "the captured calls still travel with the failure"


OVERFLOWS = """from openai import OpenAI
client = OpenAI(max_retries=0)
client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 3000}])
"""
"""A harness whose second (last) model call no longer fits the model's context."""
PLANTS_AN_EXIT = """from openai import OpenAI
OpenAI(max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
open("solution.py", "w").write("import os\\nos._exit(0)\\n")
"""
"""A harness that leaves a module that ends whatever process imports it."""


def test_what_the_agent_caused_is_scored_with_the_lowest_reward(node_factory: NodeFactory, standin: RolloutStandIn):
    node_factory({"context_length": 1024, "replies": [{"text": "done"}]})
    would_pay = {"kind": "command", "config": {"score": "echo 1 > $LODESTAR_REWARD_FILE", "reward_range": [-1, 1]}}
    imports = {"kind": "python", "config": {"function": "tests.gateway.node.verifier_functions:imports_solution"}}
    standin.offer(
        assignment("overflow", command=["{python}", "-c", OVERFLOWS], verifier=would_pay),
        assignment("exits", command=["{python}", "-c", PLANTS_AN_EXIT], verifier=imports),
    )
    results = {r.session_id: r for r in standin.wait_results(2, timeout=60)}
    overflow, exits = results["overflow"], results["exits"]
    assert overflow.outcome == rollout_pb2.SESSION_OUTCOME_SCORED, standin.describe(overflow)
    assert overflow.reward == -1.0, "the low end of the range; the verifier does not run"
    assert "refused the agent's last model call" in overflow.error
    assert "context length is 1024" in overflow.verifier_details["agent_failure"]
    assert len(overflow.calls) == 1
    assert exits.outcome == rollout_pb2.SESSION_OUTCOME_SCORED, standin.describe(exits)
    assert exits.reward == 0.0
    assert "without a result" in exits.error


def test_cancellation_from_rollout_kills_the_attempt(
    node_factory: NodeFactory, standin: RolloutStandIn, tmp_path: Path
):
    stack = node_factory({"replies": [{"text": "first"}]}, host_sandbox="namespaces")  # PIDFILE: as above
    pidfile = tmp_path / "pids"
    standin.offer(assignment("c", command=HANG_AGENT, env={"PIDFILE": str(pidfile)}))
    try:
        standin.wait_for(lambda: len(read_pids(pidfile)) == 2, 30, "the harness to hang")
        standin.cancel("c")
        (result,) = standin.wait_results(1, timeout=30)
        assert result.outcome == rollout_pb2.SESSION_OUTCOME_CANCELLED, standin.describe(result)
        assert result.error == "cancelled by rollout"
        assert len(result.calls) == 1
        assert wait_dead(read_pids(pidfile))
        assert not any(sessions_dir(stack).iterdir())
    finally:
        kill_pids(read_pids(pidfile))


def test_complete_session_is_retried_then_fenced_results_are_dropped(
    node_factory: NodeFactory, standin: RolloutStandIn
):
    node_factory({"replies": [{"text": "done"}]})
    standin.fail_next_completes(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)
    standin.offer(assignment("retried", command=AGENT))
    (result,) = standin.wait_results(1, timeout=60)
    assert result.outcome == SCORED
    assert standin.complete_calls == 3

    standin.fence("fenced")
    standin.offer(assignment("fenced", command=AGENT))
    standin.wait_for(lambda: standin.complete_calls == 4, 60, "the fenced report")
    time.sleep(1.0)
    assert standin.complete_calls == 4, "a fenced result is not retried"
    assert [r.session_id for r in standin.results] == ["retried"]
    standin.wait_for(lambda: not standin.acquires[-1].in_flight, 5, "the node to drop the fenced attempt")


def test_reported_sessions_leave_the_capture_store_and_unreported_ones_stay(
    node_factory: NodeFactory, standin: RolloutStandIn
):
    """With no retention, a session leaves the node's capture store at the sweep after rollout took its result;
    one whose result rollout never took (reporting gave up) stays for the longer window."""
    stack = node_factory({"replies": [{"text": "done"}]}, capture_retention_s=0, capture_sweep_s=0.2,
                         complete_attempts=1)  # fmt: skip
    store = stack.node.store
    standin.offer(assignment("taken", command=AGENT))
    standin.wait_results(1, timeout=60)
    standin.fail_next_completes(grpc.StatusCode.UNAVAILABLE)
    standin.offer(assignment("lost", command=AGENT))
    standin.wait_for(lambda: standin.complete_calls == 2, 60, "the failed report")

    wait_until(
        lambda: stack.call(store.stored()),
        10,
        what="(sessions, calls) = (1, 1) stored",
        until=lambda stored: stored == (1, 1),
    )
    ((kept, _),) = stack.call(store.sessions())
    assert kept.labels["rollout_session_id"] == "lost"
    assert stack.node.retention.pruned == 1


def test_a_node_that_runs_sessions_needs_etcd(tmp_path: Path):
    with pytest.raises(InvalidArgumentError, match="--rollout needs --etcd"):
        GatewayNode(GatewaySettings(rollout="127.0.0.1:1", etcd=None, data_dir=tmp_path))
