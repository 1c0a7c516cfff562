"""End to end on the real stack (processes): scripted inference, the rollout service (with a standby on the
same store), two gateway nodes pulling sessions, its own etcd.

Runs with the example agent (official openai SDK, a `shell` tool round trip) and with real harnesses (Pi,
Claude Code) as `HarnessSpec.kind`; faults under running runs: SIGKILL of a node, a hanging harness, a
crashing verifier, SIGKILL of the rollout leader, etcd stopped and restarted. One stack for the module (it
is started once: ~10 s); each test creates its own run through the `lodestar run` CLI. The infrastructure
faults come last (they change the leader and the nodes' leases).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import make_harness
from tests.conftest import EtcdServer, _healthy
from tests.e2e.node_stack import AGENT, NodeStack, out_txt_spec

pytestmark = pytest.mark.slow
HANG_AGENT = ["{python}", "{repo}/tests/gateway/node/hang_agent.py", "{prompt}"]
SCRIPT = {
    "replies": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 1; echo hi > out.txt"}}]},
        {"text": "done"},
    ]
}
HARNESS_SCRIPT = {
    "replies": [
        {
            "tool_calls": [
                {"name": ["bash", "Bash"], "arguments": {"command": "echo hi > out.txt", "description": "Write it"}}
            ]
        },
        {"text": "done"},
    ]
}
TODAY = re.compile(r"Today's date is (\d{4}-\d{2}-\d{2})\.")
"""Claude Code ends its first prompt with today's date from its own clock (local time in the sandbox): the one
part of a first prompt that may differ between samples of a task (docs/testing.md, "First prompts")."""


def first_difference(a: str, b: str, context: int = 120) -> str:
    """Where two original requests first differ, less their per-session ids (metadata), for a failure message."""
    a, b = (json.dumps({k: v for k, v in json.loads(r).items() if k != "metadata"}) for r in (a, b))
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at char {at}: {a[max(0, at - context) : at + context]!r} vs {b[max(0, at - context) : at + context]!r}"


SLOW_SCRIPT = {
    "replies": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 2; echo hi > out.txt"}}]},
        {"text": "done"},
    ]
}


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """This module's own etcd: the last test stops and restarts it."""
    server = EtcdServer(tmp_path_factory.mktemp("node-e2e-etcd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdServer) -> Iterator[NodeStack]:
    root = tmp_path_factory.mktemp("node-e2e")
    prefix = f"/e2e/{uuid.uuid4().hex}/"
    # The weaker isolation: these tests watch harness and verifier processes from the host (a PIDFILE, crash
    # marks that must outlive an attempt), which the sandbox hides by design (tests/gateway/node/test_sandbox.py
    # and the harness-training e2e module run sessions in it).
    insecure = {"host-sandbox": "namespaces"}
    with NodeStack.start(root, etcd.endpoint, prefix, script=SCRIPT, standby=True, **insecure) as started:
        yield started


def _spec(name: str, tasks: list[dict[str, Any]], group_size: int, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "tasks": tasks,
        "groupSize": group_size,
        "harness": {"kind": "command", "command": AGENT, "model": "lodestar-tiny"},
        "verifier": {"kind": "exact_match"},
        "earlyStopFraction": 1.0,
        "maxAttempts": 3,
        "sessionTimeout": "120s",
        "agentTimeout": "60s",
    }
    spec.update(fields)
    return spec


def test_example_agent_run_three_tasks_by_four(stack: NodeStack):
    stack.set_script(SCRIPT)
    tasks = [
        {"taskId": f"t{i}", "prompt": f"Write hi into out.txt ({i}), then say done.", "metadata": {"answer": answer}}
        for i, answer in enumerate(["done", "done", "something else"])
    ]
    run_id = stack.create_run(_spec("example-agent", tasks, 4))

    run = stack.wait_run(run_id)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_total, run.sessions_succeeded, run.sessions_failed) == (12, 12, 0)
    assert run.groups_complete == 3
    assert run.reward_mean == pytest.approx(2 / 3)
    groups = stack.groups(run_id)
    assert sorted(group.task_id for group in groups) == ["t0", "t1", "t2"]
    nodes = set()
    for group in groups:
        assert len(group.sessions) == 4
        expected = 0.0 if group.task_id == "t2" else 1.0
        first_prompts = set()
        for session in group.sessions:
            nodes.add(session.node_id)
            assert session.outcome == rollout_pb2.SESSION_OUTCOME_SCORED
            assert session.reward == expected
            assert session.final_answer == "done"
            assert len(session.calls) == 2
            for call in session.calls:
                assert len(call.prompt_token_ids) > 0
                assert len(call.completion_token_ids) > 0
                assert len(call.completion_logprobs) == len(call.completion_token_ids)
            assert session.calls[0].completion.tool_calls[0].name == "shell"
            assert session.verifier_details["runtime"]["fixed_paths"] is True
            first_prompts.add(tuple(session.calls[0].prompt_token_ids))
        assert len(first_prompts) == 1, "every sample of a task starts from the same prompt tokens"
    assert nodes == {"node-0", "node-1"}
    status = stack.status(run_id)
    assert status["sessionsSucceeded"] == 12
    assert status["groupsComplete"] == 3
    assert status["state"] == "RUN_STATE_COMPLETED"
    assert set(status["stageSecondsMean"]) >= {"init", "run", "post"}


@pytest.mark.harness
@pytest.mark.parametrize(("kind", "binary"), [("pi", "pi"), ("claude_code", "claude_code"), ("opencode", "opencode")])
def test_real_harness_run_three_tasks_by_four(stack: NodeStack, kind: str, binary: str):
    if not make_harness(binary).is_installed():
        pytest.fail(f"{make_harness(binary).binary} is not installed: run `make harnesses`", pytrace=False)
    stack.set_script(HARNESS_SCRIPT)
    spec = out_txt_spec(kind, ["hi", "hi", "bye"], group_size=4)
    run_id = stack.create_run(spec, name=f"{kind}.yaml")

    run = stack.wait_run(run_id, timeout=300)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_succeeded, run.infra_failures) == (12, 0), run
    assert run.reward_mean == pytest.approx(2 / 3)
    groups = stack.groups(run_id)
    assert len(groups) == 3
    for group in groups:
        expected = 0.0 if group.task_id.endswith("-2") else 1.0
        first_prompts: dict[str, dict[tuple[int, ...], str]] = {}
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
            request = session.calls[0].original_request_json
            dated = TODAY.search(request)
            prompt = tuple(session.calls[0].prompt_token_ids)
            first_prompts.setdefault(dated.group(1) if dated else "", {})[prompt] = request
        # Samples of a task start from the same tokens, except Claude Code's date line when a group straddles
        # midnight (it is ~20 tokens from the end of a ~16.5K-token prompt: the tree builder still shares the rest).
        for date, prompts in first_prompts.items():
            requests = list(prompts.values())
            assert len(prompts) == 1, (
                f"{kind}: samples of one task ({date or 'no date'}) start from different prompt tokens: "
                f"{first_difference(requests[0], requests[1])}"
            )


def test_sigkill_of_a_node_requeues_its_sessions_counted_once(stack: NodeStack):
    slow = {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 4; echo hi > out.txt"}}]}
    stack.set_script({"replies": [slow, {"text": "done"}]})
    tasks = [{"taskId": f"k{i}", "prompt": "Write hi into out.txt.", "metadata": {"answer": "done"}} for i in range(2)]
    run_id = stack.create_run(_spec("sigkill", tasks, 4), name="sigkill.yaml")
    victim = stack.nodes[0]
    deadline = time.monotonic() + 30
    while stack.node_status(victim).stage_counts["RUN"] < 2:
        assert time.monotonic() < deadline, "node-0 never ran two sessions"
        time.sleep(0.1)
    held = stack.store_rows(
        "SELECT session_id, attempt FROM sessions WHERE run_id = ? AND node_id = 'node-0' AND counted = 0", run_id
    )
    assert held

    victim.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    requeued_within = None
    while time.monotonic() - killed_at < 15:
        now = {sid: (status, attempt) for sid, status, attempt in stack.store_rows(
            "SELECT session_id, status, attempt FROM sessions WHERE run_id = ?", run_id)}  # fmt: skip
        if all(now[sid][0] == "pending" or now[sid][1] > attempt for sid, attempt in held):
            requeued_within = time.monotonic() - killed_at
            break
        time.sleep(0.2)
    assert requeued_within is not None, "the dead node's sessions were not requeued"
    assert requeued_within < 3 + 3, f"requeued {requeued_within:.1f} s after the kill (lease TTL 3 s)"
    stack.nodes[0] = stack.restart_node(0)

    run = stack.wait_run(run_id)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED
    assert (run.sessions_succeeded, run.sessions_total) == (8, 8)
    counted = stack.store_rows(
        "SELECT r.session_id, SUM(r.counted) FROM results r JOIN sessions s ON s.session_id = r.session_id "
        "WHERE s.run_id = ? GROUP BY r.session_id",
        run_id,
    )
    assert len(counted) == 8
    assert all(total == 1 for _, total in counted), counted
    # A late result from the dead node's attempt is refused (fencing).
    session_id, attempt = held[0]
    late = rollout_pb2.SessionResult(
        session_id=session_id, attempt=attempt, node_id="node-0", outcome=rollout_pb2.SESSION_OUTCOME_SCORED, reward=1
    )
    with pytest.raises(grpc.RpcError) as refused:
        stack.stub().CompleteSession(rollout_pb2.CompleteSessionRequest(result=late), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    for index in range(2):
        assert list((stack.root / f"node-{index}" / "sessions").iterdir()) == []


def test_a_rolling_restart_of_every_node_costs_no_session_an_attempt(stack: NodeStack):
    """maxAttempts 1: a session that lost an attempt would fail for good. Each node in turn gets SIGTERM while it
    runs sessions and comes back; its sessions are handed back (CANCELLED, "node draining") and run elsewhere."""
    slow = {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 3; echo hi > out.txt"}}]}
    stack.set_script({"replies": [slow, {"text": "done"}]})
    tasks = [{"taskId": f"r{i}", "prompt": "Write hi into out.txt.", "metadata": {"answer": "done"}} for i in range(2)]
    run_id = stack.create_run(_spec("rolling", tasks, 4, maxAttempts=1), name="rolling.yaml")
    drained = 0
    for index in range(len(stack.nodes)):
        node = stack.nodes[index]
        deadline = time.monotonic() + 30
        while stack.node_status(node).stage_counts["RUN"] < 1:
            assert time.monotonic() < deadline, f"node-{index} never ran a session"
            time.sleep(0.1)
        assert node.stop(signal.SIGTERM) == 0
        drained += 1
        stack.nodes[index] = stack.restart_node(index)

    run = stack.wait_run(run_id)

    assert run.state == rollout_pb2.RUN_STATE_COMPLETED
    assert (run.sessions_succeeded, run.sessions_total) == (8, 8), "no session failed"
    handed_back = stack.store_rows(
        "SELECT a.node_id, a.error FROM attempts a JOIN sessions s ON s.session_id = a.session_id "
        "WHERE s.run_id = ? AND a.outcome = 'cancelled'",
        run_id,
    )
    assert {node for node, _ in handed_back} == {f"node-{i}" for i in range(drained)}, handed_back
    assert all(error.startswith("node draining") for _, error in handed_back), handed_back
    failed = stack.store_rows(
        "SELECT COUNT(*) FROM sessions WHERE run_id = ? AND (failures > 0 OR status = 'failed')", run_id
    )
    assert failed == [(0,)]


def test_hanging_harness_is_timed_out_killed_and_cleaned_up(stack: NodeStack, tmp_path: Path):
    stack.set_script(SCRIPT)
    pidfile = tmp_path / "pids"
    harness = {"kind": "command", "command": HANG_AGENT, "env": {"PIDFILE": str(pidfile)}}
    verifier = {"kind": "command", "config": {"score": "echo '{\"reward\": 0.5}' > $LODESTAR_REWARD_FILE"}}
    tasks = [{"taskId": "hang", "prompt": "hang"}]
    run_id = stack.create_run(
        _spec("hang", tasks, 2, harness=harness, verifier=verifier, agentTimeout="8s"), name="hang.yaml"
    )
    run = stack.wait_run(run_id, timeout=60)
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED
    assert (run.sessions_succeeded, run.sessions_timed_out) == (2, 2)
    (group,) = stack.groups(run_id)
    for session in group.sessions:
        assert session.outcome == rollout_pb2.SESSION_OUTCOME_TIMED_OUT
        assert session.reward == 0.5
        assert len(session.calls) == 1
    pids = [int(pid) for pid in pidfile.read_text().split()]
    assert len(pids) == 4
    assert _all_dead(pids), "every harness process and its background child are killed"
    for index in range(2):
        assert list((stack.root / f"node-{index}" / "sessions").iterdir()) == []


def test_crashing_verifier_is_an_infra_failure_and_retried(stack: NodeStack, tmp_path: Path):
    stack.set_script(SCRIPT)
    marks = tmp_path / "marks"
    marks.mkdir()
    crash_once = (
        f"m={marks}/$LODESTAR_TASK_ID; if [ -e $m ]; then echo 1 > $LODESTAR_REWARD_FILE; else touch $m; kill -9 $$; fi"
    )
    tasks = [{"taskId": f"v{i}", "prompt": "Write hi into out.txt."} for i in range(2)]
    verifier = {"kind": "command", "config": {"score": crash_once}}  # the trusted step: its crash is the node's
    run_id = stack.create_run(_spec("verifier-crash", tasks, 1, verifier=verifier), name="crash.yaml")
    run = stack.wait_run(run_id)
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED
    attempts = stack.store_rows(
        "SELECT a.session_id, a.attempt, a.node_id, a.outcome, a.error FROM attempts a "
        "JOIN sessions s ON s.session_id = a.session_id WHERE s.run_id = ?",
        run_id,
    )
    assert (run.sessions_succeeded, run.infra_failures) == (2, 2), attempts
    for group in stack.groups(run_id):
        (session,) = group.sessions
        assert session.reward == 1.0
        assert session.attempt == 2
    failed = stack.store_rows(
        "SELECT a.error FROM attempts a JOIN sessions s ON s.session_id = a.session_id WHERE s.run_id = ? "
        "AND a.attempt = 1",
        run_id,
    )
    assert len(failed) == 2
    assert all("verifier" in error and "signal 9" in error for (error,) in failed), failed


def _run(stack: NodeStack, name: str) -> str:
    prompt, answer = "Write hi into out.txt.", {"answer": "done"}
    tasks = [{"taskId": f"{name}{i}", "prompt": prompt, "metadata": answer} for i in (0, 1)]
    spec = {
        "name": name,
        "tasks": tasks,
        "groupSize": 4,
        "harness": {"kind": "command", "command": AGENT},
        "verifier": {"kind": "exact_match"},
        "earlyStopFraction": 1.0,
        "maxAttempts": 3,
    }
    return stack.create_run(spec, name=f"{name}.yaml")


def _wait_some_done(stack: NodeStack, run_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = stack.get_run(run_id)
        if run.sessions_succeeded >= 1 and run.sessions_running >= 1:
            return
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never had finished and running sessions at once")


def _assert_complete_and_counted_once(stack: NodeStack, run_id: str) -> None:
    run = stack.wait_run(run_id, timeout=120)
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    assert (run.sessions_total, run.sessions_succeeded, run.groups_complete) == (8, 8, 2)
    query = (
        "SELECT s.session_id, COALESCE(SUM(r.counted), 0) FROM sessions s LEFT JOIN results r "
        "ON r.session_id = s.session_id WHERE s.run_id = ? GROUP BY s.session_id"
    )
    # GetRun answers from memory, which is updated before the batched store write lands (a CompleteSession is
    # acknowledged only after it landed): under load the last result can reach the file a moment later.
    deadline = time.monotonic() + 30
    while True:
        counted = stack.store_rows(query, run_id)
        if (len(counted) == 8 and all(total == 1 for _, total in counted)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(counted) == 8
    assert all(total == 1 for _, total in counted), counted
    groups = stack.groups(run_id)
    assert sorted(len(group.sessions) for group in groups) == [4, 4]


def test_rollout_leader_killed_standby_takes_over_and_the_run_completes(stack: NodeStack):
    stack.set_script(SLOW_SCRIPT)
    run_id = _run(stack, "leader")
    _wait_some_done(stack, run_id)

    took_over_s = stack.fail_over()

    assert took_over_s < 15
    _assert_complete_and_counted_once(stack, run_id)


def test_etcd_stopped_and_restarted_the_run_completes(stack: NodeStack, etcd: EtcdServer, tmp_path: Path):
    stack.set_script(SLOW_SCRIPT)
    run_id = _run(stack, "etcd")
    _wait_some_done(stack, run_id)
    argv = list(etcd.process.args)  # type: ignore[arg-type]
    etcd.stop()
    time.sleep(3)
    with (tmp_path / "etcd.log").open("ab") as log:
        etcd.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while not _healthy(etcd.endpoint):
        assert time.monotonic() < deadline, "etcd did not come back"
        time.sleep(0.1)

    _assert_complete_and_counted_once(stack, run_id)


def _all_dead(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() and "State:\tZ" not in _status(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
