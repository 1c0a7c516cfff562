"""`lodestar run create / status / cancel` against a real rollout service."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.rollout.helpers import Rollout, run_lodestar

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "runs"


@pytest.mark.slow
async def test_create_status_and_cancel(rollout: Rollout, tmp_path: Path) -> None:
    for name in ("command-agent.yaml", "tasks.jsonl"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    code, out, _ = await run_lodestar(
        "run", "create", str(tmp_path / "command-agent.yaml"), "--rollout", rollout.address
    )
    assert code == 0
    run_id = out.strip()
    assert run_id.startswith("run-")

    code, out, _ = await run_lodestar("run", "status", run_id, "--json", "--rollout", rollout.address)
    run = json.loads(out)
    assert (run["runId"], run["sessionsTotal"], run["sessionsPending"], run["state"]) == (
        run_id,
        12,
        12,
        "RUN_STATE_RUNNING",
    )
    assert run["spec"]["harness"]["command"] == ["python", "{repo}/examples/agent/agent.py", "{prompt}"]

    code, out, _ = await run_lodestar("run", "status", run_id, "--once", "--rollout", rollout.address)
    assert code == 0
    assert "pending" in out
    assert "running" in out
    assert "0/3" in out  # groups complete of tasks

    code, out, _ = await run_lodestar("run", "cancel", run_id, "--rollout", rollout.address)
    assert "12 sessions cancelled" in out
    code, out, _ = await run_lodestar("run", "status", run_id, "--rollout", rollout.address)  # live: ends at once
    assert code == 0
    assert "cancelled" in out


@pytest.mark.slow
async def test_bad_spec_and_unknown_run_fail_with_a_message(rollout: Rollout, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("groupSize: 0\ntasks: [{taskId: a}]\nharness: {kind: pi}\n")
    code, _, err = await run_lodestar("run", "create", str(tmp_path / "bad.yaml"), "--rollout", rollout.address)
    assert code == 2
    assert "group_size must be at least 1" in err
    code, _, err = await run_lodestar("run", "status", "run-missing", "--once", "--rollout", rollout.address)
    assert code == 2
    assert "no run 'run-missing'" in err
