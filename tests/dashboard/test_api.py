"""The dashboard's JSON endpoints and pages against a real rollout service with a finished run (`stack`):
what each shows, pagination of a large session, 404s and bad input (never a stack trace), token auth."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar_app.dashboard import server
from lodestar_trainer.step.advantages import AdvantageKind, group_advantages
from tests.dashboard.stack import INFRA_ERROR, LARGE_CALLS, REWARDS, STEPS, TOKEN, DashboardStack


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def get_json(stack: DashboardStack, path: str) -> Any:
    status, body, _ = fetch(stack.url + path)
    assert status == 200, body
    return json.loads(body)


def test_runs_table(stack: DashboardStack) -> None:
    assert stack.run is not None
    (run,) = [row for row in get_json(stack, "api/runs")["runs"] if row["run_id"] == stack.run.run_id]
    assert run["name"] == "dashboard-test"
    assert run["state"] == "completed"
    assert run["progress"] == 1.0
    assert run["tasks"] == 3
    assert run["sessions"]["scored"] == 9
    assert run["sessions"]["total"] == 9
    assert run["infra_failures"] == 1
    assert run["steps"] == STEPS
    assert run["groups"] == {"complete": 3, "delivered": 0, "trained": 2 * STEPS, "stale": 0, "no_signal": 1}
    every = [reward for rewards in REWARDS.values() for reward in rewards]
    assert run["reward_mean"] == pytest.approx(sum(every) / len(every))


def test_curves_have_one_point_per_step(stack: DashboardStack) -> None:
    assert stack.run is not None
    curves = get_json(stack, f"api/runs/{stack.run.run_id}/curves")
    assert curves["steps"] == list(range(1, STEPS + 1))
    charts = {chart["title"]: chart for chart in curves["charts"]}
    assert charts["reward"]["series"] == ["reward_mean", "reward_std"]
    assert charts["reward"]["values"][0] == pytest.approx([r.values["reward_mean"] for r in stack.run.metrics])
    assert charts["step time (s)"]["series"] == ["time_build", "time_forward_backward", "time_push"]
    assert "custom_metric" in charts  # a metric no named chart takes gets its own
    for chart in curves["charts"]:
        assert all(len(values) == STEPS for values in chart["values"]), chart["title"]


def test_groups_with_rewards_advantages_and_failures(stack: DashboardStack) -> None:
    assert stack.run is not None
    view = get_json(stack, f"api/runs/{stack.run.run_id}")
    groups = {group["task_id"]: group for group in view["groups"]}
    for task_id, rewards in REWARDS.items():
        samples = groups[task_id]["samples"]
        assert [sample["reward"] for sample in samples] == rewards
        expected = group_advantages(rewards, AdvantageKind.ZSCORE)
        assert [sample["advantage"] for sample in samples] == pytest.approx(expected)
    assert groups["task-0"]["signal"]
    assert not groups["task-1"]["signal"]
    failed = next(s for s in groups["task-2"]["samples"] if s["session_id"] == stack.run.failed_session)
    assert failed["failures"] == 1
    assert failed["attempt"] == 2
    (cause,) = view["failures"]
    assert cause["count"] == 1
    assert cause["sessions"] == [stack.run.failed_session]
    assert cause["cause"] == "infra_failed: runtime: container … died (exit 137)"  # the id blanked, first line
    assert INFRA_ERROR.splitlines()[0].startswith("runtime: container")


def test_session_calls_timeline_and_harness_output(stack: DashboardStack) -> None:
    assert stack.run is not None
    view = get_json(stack, f"api/sessions/{stack.run.chained_session}")
    assert view["session"]["run_id"] == stack.run.run_id
    assert view["session"]["task_id"] == "task-0"
    assert view["call_count"] == 3
    assert [call["chain"] for call in view["calls"]] == [
        {"continued_from": None, "start": "first", "reused_tokens": 0},
        {"continued_from": 0, "start": "continued", "reused_tokens": view["calls"][0]["prompt_tokens"] + 8},
        {"continued_from": None, "start": "drift", "reused_tokens": 0},
    ]
    result = view["result"]
    assert result["stdout_tail"].startswith("agent stdout of task-0/0")
    assert result["stderr_tail"] == "warning: something on stderr"
    assert result["verifier_details"]["output"] == "task-0 sample 0"
    assert result["stages"]["run"] == pytest.approx(4.0)
    assert [a["outcome"] for a in view["attempts"]] == ["scored"]
    failed = get_json(stack, f"api/sessions/{stack.run.failed_session}")
    assert [(a["outcome"], a["error"]) for a in failed["attempts"]] == [("infra_failed", INFRA_ERROR), ("scored", "")]


def test_large_session_is_paginated_and_fast(stack: DashboardStack) -> None:
    assert stack.run is not None
    started = time.monotonic()
    view = get_json(stack, f"api/sessions/{stack.run.large_session}")
    first_page = time.monotonic() - started
    assert view["call_count"] == LARGE_CALLS
    assert [call["sequence"] for call in view["calls"]] == list(range(server.DEFAULT_PAGE))
    last = get_json(stack, f"api/sessions/{stack.run.large_session}?offset=280&limit=200")
    assert [call["sequence"] for call in last["calls"]] == list(range(280, LARGE_CALLS))
    started = time.monotonic()
    call = get_json(stack, f"api/sessions/{stack.run.large_session}/calls/299")
    assert call["sequence"] == 299
    assert len(call["original_request"]) > 50_000
    assert first_page < 3.0
    assert time.monotonic() - started < 3.0


def test_call_tokens_logprobs_and_conversation(stack: DashboardStack) -> None:
    assert stack.run is not None
    call = get_json(stack, f"api/sessions/{stack.run.chained_session}/calls/1")
    assert call["decoded"]
    assert "".join(token["text"] for token in call["sampled"]) == "Running the tests now: 1 failed, 3 passed."
    assert [token["logprob"] for token in call["sampled"]] == pytest.approx(
        [-((index * 7) % 10) / 3 for index in range(len(call["sampled"]))]
    )
    assert call["prompt_shared"] == call["chain"]["reused_tokens"] > 0
    assert len(call["prompt"]) == call["prompt_tokens"]
    assert [message["role"] for message in call["messages"]] == ["system", "user", "assistant", "tool"]
    assert call["messages"][3]["tool_result"]["name"] == "read"
    assert call["completion"]["tool_calls"] == [{"id": "c2", "name": "run_tests", "arguments": '{"path": "."}'}]
    assert call["call_count"] == 3


@pytest.mark.parametrize(
    "path",
    [
        "api/runs/run-nope",
        "api/runs/run-nope/curves",
        "api/sessions/nope",
        "api/sessions/nope/calls/0",
        "api/sessions/{session}/calls/7",
        "api/nothing",
        "runs/run-nope",
        "sessions/nope",
        "sessions/{session}/calls/3",
        "sessions/{session}/calls/x",
        "static/nope.js",
    ],
)
def test_unknown_ids_answer_404_without_a_trace(stack: DashboardStack, path: str) -> None:
    assert stack.run is not None
    status, body, headers = fetch(stack.url + path.format(session=stack.run.chained_session))
    assert status == 404, body
    assert "Traceback" not in body
    assert ".py" not in body
    if path.startswith("api/") and path != "api/nothing":
        assert "error" in json.loads(body)
    if path.startswith(("runs/", "sessions/")):
        assert headers["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("query", ["offset=-1", "limit=0", "limit=1000", "offset=abc"])
def test_bad_paging_is_a_400(stack: DashboardStack, query: str) -> None:
    assert stack.run is not None
    status, body, _ = fetch(f"{stack.url}api/sessions/{stack.run.chained_session}?{query}")
    assert status == 400
    assert json.loads(body)["error"]


def test_pages_serve_the_app_and_its_vendored_chart_library(stack: DashboardStack) -> None:
    assert stack.run is not None
    for path in ("", f"runs/{stack.run.run_id}", f"sessions/{stack.run.chained_session}/calls/2"):
        status, body, _ = fetch(stack.url + path)
        assert status == 200
        assert "/static/vendor/uPlot.iife.min.js" in body
    status, body, _ = fetch(stack.url + "static/vendor/uPlot.iife.min.js")
    assert status == 200
    assert "uPlot" in body
    assert "http://" not in fetch(stack.url)[1]
    assert "https://" not in fetch(stack.url)[1]


def test_token_auth(stack: DashboardStack) -> None:
    assert fetch(stack.token_url + "api/runs")[0] == 401
    assert fetch(stack.token_url)[0] == 401
    assert fetch(stack.token_url + "api/runs", {"Authorization": "Bearer wrong"})[0] == 401
    assert fetch(stack.token_url + "api/runs", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    status, _, headers = fetch(f"{stack.token_url}?token={TOKEN}")
    assert status == 200
    assert "HttpOnly" in headers["Set-Cookie"]
    cookie = headers["Set-Cookie"].split(";")[0]
    assert fetch(stack.token_url + "api/runs", {"Cookie": cookie})[0] == 200
    assert fetch(stack.token_url + "healthz")[0] == 200


def test_beyond_loopback_needs_a_token() -> None:
    server.check_bind("127.0.0.1", None)
    server.check_bind("::1", None)
    server.check_bind("0.0.0.0", "secret")
    for host in ("0.0.0.0", "", "192.168.1.5", "example.com"):
        with pytest.raises(InvalidArgumentError, match="without a token"):
            server.check_bind(host, None)
    with pytest.raises(InvalidArgumentError):
        asyncio.run(server.start(server.DashboardSettings(rollout="127.0.0.1:1", host="0.0.0.0", port=0)))
