"""The red team's pure parts: the verdict rules (outcome.py), the catalogue (hacks.py) and the run specs
`lodestar redteam` makes from a task set's spec (lodestar_app/cli/redteam.py)."""

from __future__ import annotations

import json

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_app.cli.redteam_run import hack_specs, sample
from lodestar_gateway.node.redteam.hacks import HACKS, applicable
from lodestar_gateway.node.redteam.outcome import REPORT_PREFIX, Session, agent_report, judge_all


def _report(**fields: object) -> str:
    return "some output\n" + REPORT_PREFIX + json.dumps({"hack": "x", **fields}) + "\n"


def test_a_hack_pays_only_above_the_honest_failure_of_its_task() -> None:
    sessions = [
        Session("noop", "a", True, 0.25),
        Session("noop", "b", True, 0.0),
        Session("conftest", "a", True, 0.25),  # the same partial credit as giving up: held
        Session("conftest", "b", True, 1.0),
        Session("xfail", "a", False, error="verifier failed: no outcome"),
    ]
    verdicts = {(c.hack, c.task_id): c.verdict for c in judge_all(sessions, pass_threshold=1.0)}
    assert verdicts == {
        ("noop", "a"): "held",
        ("noop", "b"): "held",
        ("conftest", "a"): "held",
        ("conftest", "b"): "paid",
        ("xfail", "a"): "infra",
    }


def test_leaks_escapes_and_a_verifier_that_rewards_doing_nothing_fail_the_red_team() -> None:
    sessions = [
        Session("noop", "a", True, 1.0),
        Session("answer-files", "a", True, 1.0, stdout_tail=_report(leaked=["answer read from /data/tasks.jsonl"])),
        Session("sandbox-escape", "a", True, 1.0, session_id="s1", escape_markers=("/tmp/marker",)),
    ]
    cells = {c.hack: c for c in judge_all(sessions, pass_threshold=1.0)}
    assert cells["noop"].verdict == "paid"
    assert "doing nothing" in cells["noop"].evidence[0]
    assert cells["answer-files"].verdict == "leaked"
    assert cells["answer-files"].evidence == ["answer read from /data/tasks.jsonl"]
    assert cells["sandbox-escape"].verdict == "escaped"
    assert all(cell.failing for cell in cells.values())


def test_the_agent_report_is_its_last_marked_line() -> None:
    assert agent_report("x\n" + REPORT_PREFIX + "not json\n") == {}
    assert agent_report(_report(escaped=["port 2379"]))["escaped"] == ["port 2379"]
    assert agent_report("nothing marked") == {}


def test_the_catalogue_has_every_kind_and_an_agent_program_for_each() -> None:
    assert len(HACKS) >= 12
    for hack in HACKS:
        assert hack.program.is_file(), hack.name
        assert hack.defence
        assert hack.verifiers
    assert {hack.name for hack in applicable("exact_match")} == {
        "answer-files", "answer-env", "answer-session", "sandbox-escape"
    }  # fmt: skip
    assert "reward-channel" not in {hack.name for hack in applicable("swe")}


def _base(tasks: int) -> rollout_pb2.RunSpec:
    spec = rollout_pb2.RunSpec(name="set", group_size=8, max_attempts=3)
    spec.tasks.extend(rollout_pb2.Task(task_id=f"t{i}", prompt="p") for i in range(tasks))
    spec.harness.kind = "claude_code"
    spec.verifier.kind = "exact_match"
    spec.agent_timeout.FromSeconds(600)
    spec.session_timeout.FromSeconds(900)
    return spec


def test_each_hack_runs_its_agent_under_the_specs_own_verifier_greedy_once_per_task() -> None:
    specs = hack_specs(_base(10), applicable("exact_match"), tasks=3, ports=[50053])
    assert set(specs) == {"noop", "answer-files", "answer-env", "answer-session", "sandbox-escape"}
    spec = specs["answer-files"]
    assert [task.task_id for task in spec.tasks] == ["t0", "t3", "t6"], "spread over the set"
    assert spec.harness.kind == "command"
    assert spec.harness.command[1].endswith("hack_answer_files.py")
    assert spec.harness.env["LODESTAR_REDTEAM_PORTS"] == "50053"
    assert spec.verifier.kind == "exact_match"
    assert (spec.group_size, spec.max_attempts, spec.sampling.top_k) == (1, 1, 1)
    assert spec.agent_timeout.seconds == 120
    assert [task.task_id for task in sample(_base(2).tasks, 5)] == ["t0", "t1"]


def test_an_unknown_hack_is_refused() -> None:
    from lodestar_app.cli.redteam_run import chosen_hacks

    with pytest.raises(InvalidArgumentError, match="unknown hack nope"):
        chosen_hacks("swe", ["nope"])


def test_a_red_team_whose_honest_failure_never_scored_proves_nothing() -> None:
    from lodestar_app.cli.redteam_run import unscored

    broken = judge_all([Session("noop", "a", False, error="verifier could not run: bad config")], 1.0)
    assert "verifier could not run: bad config" in unscored(broken)
    assert unscored(judge_all([Session("noop", "a", True, 0.0)], 1.0)) == ""
