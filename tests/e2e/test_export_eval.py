"""`lodestar export` and `lodestar eval` on the real stack (processes): scripted inference, a rollout service
on a SQLite store, one gateway node running the example agent (official openai SDK, a `shell` tool round
trip), the session's etcd. One stack for the module.

Export: a run whose first task passes and whose second fails; `--min-reward 1` keeps exactly the first
task's sessions, with the chat as the agent sent it (system, user, the assistant's tool call, the tool
result, the final answer), the tool definitions, the reward and the exact token ids (the last call's prompt
+ sampled ids; the loss mask covers the sampled ids of both calls of the chain). The Parquet file read
back with pyarrow equals the JSONL file. Eval: pass@1 / pass@k of the same task set from the CLI's JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_rollout.sft_files import from_parquet_row
from tests.e2e.node_stack import AGENT, NodeStack

pytestmark = pytest.mark.slow
SCRIPT = {
    "replies": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi > out.txt"}}]},
        {"text": "done"},
    ]
}
TASKS = [
    {"taskId": "pass", "prompt": "Write hi into out.txt, then say done.", "metadata": {"answer": "done"}},
    {"taskId": "fail", "prompt": "Write hi into out.txt, then say 42.", "metadata": {"answer": "42"}},
]


def _spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "tasks": TASKS,
        "groupSize": 2,
        "harness": {"kind": "command", "command": AGENT, "model": "lodestar-tiny"},
        "verifier": {"kind": "exact_match"},
        "sessionTimeout": "120s",
        "agentTimeout": "60s",
    }


def _lodestar(*argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodestar_app.cli.main", *argv], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[NodeStack]:
    root = tmp_path_factory.mktemp("export-eval")
    with NodeStack.start(root, etcd_endpoint, f"/e2e/{uuid.uuid4().hex}/", script=SCRIPT, nodes=1) as started:
        yield started


def test_export_keeps_accepted_sessions_with_messages_tools_and_tokens(stack: NodeStack, tmp_path: Path):
    run_id = stack.create_run(_spec("export"))
    run = stack.wait_run(run_id)
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED, run
    store = str(stack.root / "rollout.sqlite")

    jsonl, parquet = tmp_path / "sft.jsonl", tmp_path / "sft.parquet"
    for fmt, path in (("chat-jsonl", jsonl), ("parquet", parquet)):
        done = _lodestar("export", run_id, "--min-reward", "1", "--format", fmt, "--store", store, "--out", str(path))
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip() == str(path)
        assert "records" in done.stderr

    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == 2, "both samples of the passing task, none of the failing one"
    assert {r["task_id"] for r in records} == {"pass"}
    assert {r["session_id"] for r in records} == {f"{run_id}-g0-s0", f"{run_id}-g0-s1"}
    results = {s.session_id: s for g in stack.groups(run_id) for s in g.sessions}
    for record in records:
        assert record["reward"] == 1.0
        roles = [m["role"] for m in record["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        call = record["messages"][2]["tool_calls"][0]
        assert call["function"]["name"] == "shell"
        assert json.loads(call["function"]["arguments"]) == {"command": "echo hi > out.txt"}
        assert record["messages"][3]["tool_call_id"] == call["id"]
        assert record["messages"][-1]["content"] == "done"
        assert [t["function"]["name"] for t in record["tools"]] == ["shell"]
        assert record["tools"][0]["function"]["parameters"]["type"] == "object"
        calls = results[record["session_id"]].calls
        assert len(calls) == 2
        assert calls[1].continued_from_sequence == 0
        assert record["token_ids"] == [*calls[1].prompt_token_ids, *calls[1].completion_token_ids]
        assert len(record["loss_mask"]) == len(record["token_ids"])
        assert sum(record["loss_mask"]) == len(calls[0].completion_token_ids) + len(calls[1].completion_token_ids)
        assert record["loss_mask"][-1] == 1
        assert record["loss_mask"][0] == 0
        first = len(calls[0].prompt_token_ids)
        sampled = [t for t, m in zip(record["token_ids"], record["loss_mask"], strict=True) if m]
        assert sampled[: len(calls[0].completion_token_ids)] == list(calls[0].completion_token_ids)
        assert record["token_ids"][:first] == list(calls[0].prompt_token_ids)

    table = pq.read_table(parquet)
    assert table.num_rows == 2
    assert [from_parquet_row(row) for row in table.to_pylist()] == records

    everything = _lodestar(
        "export", run_id, "--min-reward", "0", "--store", store, "--out", str(tmp_path / "all.jsonl")
    )
    assert everything.returncode == 0, everything.stderr
    assert len((tmp_path / "all.jsonl").read_text().splitlines()) == 4
    missing = _lodestar("export", "no-such-run", "--store", store, "--out", str(tmp_path / "x.jsonl"))
    assert missing.returncode == 2
    assert "no-such-run" in missing.stderr


def test_eval_reports_pass_at_1_and_pass_at_k(stack: NodeStack, tmp_path: Path):
    spec = tmp_path / "eval.yaml"
    spec.write_text(yaml.safe_dump({**_spec("eval"), "groupSize": 1}))

    done = _lodestar("eval", str(spec), "--harness", "command", "--samples", "3", "--rollout", stack.rollout.address,
                     "--json", "--timeout-s", "200", timeout=300)  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    [result] = json.loads(done.stdout)
    assert result["harness"] == "command"
    assert (result["tasks"], result["unscored_tasks"], result["samples"], result["passed"]) == (2, 0, 6, 3)
    assert result["pass_at_1"] == pytest.approx(0.5)
    assert result["pass_at_k"] == pytest.approx(0.5)
    assert result["per_task"]["pass"]["pass@1"] == 1.0
    assert result["per_task"]["fail"]["pass@3"] == 0.0
    run = stack.get_run(result["run_id"])
    assert run.spec.group_size == 3
    assert run.spec.early_stop_fraction == 1.0
    assert run.state == rollout_pb2.RUN_STATE_COMPLETED
    assert run.spec.sampling.mode == common_pb2.SAMPLING_MODE_RUN, "eval samples as training does by default"

    table = _lodestar("eval", str(spec), "--harness", "command", "--samples", "1", "--rollout", stack.rollout.address,
                      "--sampling", "harness")  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "pass@1" in table.stdout
    assert "command" in table.stdout
    [run_id] = re.findall(r"run-[0-9a-f]{12}", table.stdout)
    assert stack.get_run(run_id).spec.sampling.mode == common_pb2.SAMPLING_MODE_HARNESS
