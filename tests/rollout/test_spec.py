"""Run specs: parsing (YAML, JSON, a JSONL tasks file), defaults, and every bad input, locally and in
CreateRun (INVALID_ARGUMENT naming the problem, nothing created)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import grpc
import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.kinds import harness_kinds
from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_rollout import spec as specs
from tests.rollout.helpers import Rollout, make_spec

TASKS = '{"task_id": "a", "prompt": "p", "files": {"x.txt": "1"}, "metadata": {"answer": "1"}}\n\n{"task_id": "b"}\n'


def test_yaml_spec_with_a_jsonl_tasks_file_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tasks.jsonl").write_text(TASKS)
    path = tmp_path / "run.yaml"
    path.write_text(
        "name: x\ntasks: data/tasks.jsonl\ngroupSize: 2\nharness: {kind: codex}\n"
        "verifier: {kind: python, config: {function: 'm:f'}}\nsessionTimeout: 90s\n"
    )
    spec = specs.load_spec_file(path)
    assert [t.task_id for t in spec.tasks] == ["a", "b"]
    assert spec.tasks[0].files["x.txt"] == "1"
    assert spec.tasks[0].metadata["answer"] == "1"
    assert spec.session_timeout.seconds == 90
    filled = specs.with_defaults(spec)
    assert (filled.max_attempts, filled.early_stop_fraction, filled.max_staleness) == (3, 1.0, 4)
    assert filled.agent_timeout.seconds == 90  # the default 1200 s, capped by the session timeout
    assert filled.harness.model == "lodestar"
    assert filled.sampling == common_pb2.SamplingPolicy(
        mode=common_pb2.SAMPLING_MODE_RUN, temperature=1.0, top_p=1.0, top_k=0
    ), "the default sampling policy, explicit"


def test_a_partial_sampling_policy_keeps_its_values_and_defaults_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "tasks: [{taskId: a}]\ngroupSize: 2\nharness: {kind: pi}\nverifier: {kind: command}\n"
        "sampling: {temperature: 0.7}\n"
    )
    filled = specs.with_defaults(specs.load_spec_file(path))
    assert filled.sampling.mode == common_pb2.SAMPLING_MODE_RUN
    assert (filled.sampling.temperature, filled.sampling.top_p, filled.sampling.top_k) == (
        pytest.approx(0.7),
        1.0,
        0,
    )


def test_json_spec_with_inline_tasks(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(
        '{"tasks": [{"task_id": "t"}], "group_size": 3, "harness": {"kind": "pi"},'
        ' "verifier": {"kind": "command"}, "early_stop_fraction": 0.5}'
    )
    spec = specs.load_spec_file(path)
    assert (spec.group_size, spec.early_stop_fraction, len(spec.tasks)) == (3, 0.5, 1)
    assert specs.required_scored(spec) == 2


@pytest.mark.parametrize("kind", harness_kinds())
def test_every_harness_kind_a_node_runs_is_accepted(kind: str) -> None:
    command = ["agent", "{prompt}"] if kind == "command" else []
    specs.validate_spec(make_spec(harness=rollout_pb2.HarnessSpec(kind=kind, command=command)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"group_size": 0}, "group_size"),
        ({"tasks": 0}, "no tasks"),
        ({"harness": rollout_pb2.HarnessSpec(kind="cursor")}, "unknown harness kind 'cursor'"),
        ({"harness": rollout_pb2.HarnessSpec(kind="command")}, "needs harness.command"),
        ({"harness": rollout_pb2.HarnessSpec(kind="pi:bedrock")}, "unknown Pi API 'bedrock'"),
        (
            {
                "harness": rollout_pb2.HarnessSpec(
                    kind="pi:openai-responses", env={"LODESTAR_PI_API": "openai-completions"}
                )
            },
            "name different Pi APIs",
        ),
        ({"verifier": rollout_pb2.VerifierSpec(kind="llm_judge")}, "unknown verifier kind 'llm_judge'"),
        ({"early_stop_fraction": 1.5}, "early_stop_fraction"),
        ({"early_stop_fraction": -0.1}, "early_stop_fraction"),
        ({"early_stop_fraction": float("nan")}, "early_stop_fraction"),
        ({"sampling": common_pb2.SamplingPolicy(temperature=-1.0)}, "sampling.temperature must be > 0"),
        ({"sampling": common_pb2.SamplingPolicy(temperature=float("inf"))}, "sampling.temperature must be > 0"),
        ({"sampling": common_pb2.SamplingPolicy(top_p=0.0)}, r"sampling.top_p must be in \(0, 1\]"),
        ({"sampling": common_pb2.SamplingPolicy(top_k=-1)}, "sampling.top_k must be >= 0"),
    ],
)
def test_bad_specs_are_refused_naming_the_problem(change: dict[str, object], message: str) -> None:
    tasks = change.pop("tasks", 2)
    spec = make_spec(tasks=tasks, **change)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=message):
        specs.validate_spec(spec)


def test_duplicate_task_ids_and_long_agent_timeouts_are_refused() -> None:
    spec = make_spec(tasks=2)
    spec.tasks[1].task_id = "task-0"
    with pytest.raises(InvalidArgumentError, match="duplicate task id 'task-0'"):
        specs.validate_spec(spec)
    spec = make_spec()
    spec.session_timeout.FromSeconds(10)
    spec.agent_timeout.FromSeconds(20)
    with pytest.raises(InvalidArgumentError, match="agent_timeout"):
        specs.validate_spec(spec)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"run.yaml": "tasks: missing.jsonl\ngroupSize: 1\n"}, "cannot read tasks file"),
        ({"run.yaml": "tasks: t.jsonl\n", "t.jsonl": '{"task_id": "a"}\n{"nope": 1}\n'}, "line 2"),
        ({"run.yaml": "groupSize: [1\n"}, "not valid YAML"),
        ({"run.yaml": "- a list\n"}, "mapping"),
        ({"run.yaml": "groupSize: 1\nunknownField: 2\n"}, "unknownField"),
    ],
)
def test_unreadable_or_malformed_files_are_refused(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(InvalidArgumentError, match=message):
        specs.load_spec_file(tmp_path / "run.yaml")
    with pytest.raises(InvalidArgumentError, match="cannot read run spec"):
        specs.load_spec_file(tmp_path / "absent.yaml")


async def test_create_run_refuses_bad_specs_and_creates_nothing(rollout: Rollout, tmp_path: Path) -> None:
    spec = make_spec(tasks=2)
    spec.tasks[1].task_id = "task-0"
    for bad in (spec, make_spec(group_size=0), make_spec(harness=rollout_pb2.HarnessSpec(kind="nope"))):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await rollout.create_run(bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "duplicate task id" in (await _details(rollout, spec))
    with sqlite3.connect(tmp_path / "rollout.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM sessions").fetchone() == (0,)
    assert rollout.core.scheduler.runs == {}


async def _details(rollout: Rollout, spec: rollout_pb2.RunSpec) -> str:
    try:
        await rollout.create_run(spec)
    except grpc.aio.AioRpcError as error:
        return error.details() or ""
    return ""


def test_a_run_of_more_sessions_than_the_cap_is_refused() -> None:
    """tasks x group_size is capped (MAX_SESSIONS_PER_RUN): every session is a store row and a scheduler entry
    from CreateRun on, so one request must not ask for billions."""
    assert specs.MAX_SESSIONS_PER_RUN == 250_000
    specs.validate_spec(make_spec(tasks=250, group_size=1000))  # exactly the cap
    with pytest.raises(InvalidArgumentError, match="250 tasks x 1001 = 250250 sessions, above the limit of 250000"):
        specs.validate_spec(make_spec(tasks=250, group_size=1001))
    with pytest.raises(InvalidArgumentError, match="above the limit"):
        specs.validate_spec(make_spec(tasks=specs.MAX_SESSIONS_PER_RUN // 1024 + 1, group_size=1024))


async def test_create_run_refuses_a_run_above_the_session_cap(rollout: Rollout, tmp_path: Path) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rollout.create_run(make_spec(tasks=245, group_size=1024))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sessions, above the limit" in (caught.value.details() or "")
    assert rollout.core.scheduler.runs == {}
    with sqlite3.connect(tmp_path / "rollout.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM sessions").fetchone() == (0,)
