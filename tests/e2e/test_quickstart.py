"""The quickstart trains: `lodestar train` on examples/quickstart (its own etcd, inference with the tiny model,
rollout, a gateway node running the quickstart agent, the trainer), with the quickstart's seed and settings
and its 30 steps, as a subprocess. Asserts the reward rises by at least 0.3 (last 5 steps - first 5; the last
third - the first of a run cut short), every step pushed a new policy version that calls captured afterwards
report, the trainer trained on merged sequences (merge ratio > 1), and the final checkpoint resumes (step,
version, groups read, weights).

The rise is measured on the policies themselves: the mean reward of the sessions the final policy sampled
(the last version with at least MIN_SESSIONS of them) minus that of the initial policy's, from the rollout
store (every counted session, whether or not its group had signal). The trainer's per-step curve (the
summary's "reward rise") lags the policy by the samples in flight, and the groups read after its last step
are in no step of it, so a policy that saturates in the run's last step is invisible to it: in one CI run
policy v7 already scored 0.96, v8 and v9 1.0 on 3,376 sessions, while the curve's last third was 0.12, 0.10,
0.96 and its rise +0.28. The summary's rise must still be positive."""

from __future__ import annotations

import json
import re
import sqlite3
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lodestar_app.cli.train_view import reward_rise
from lodestar_trainer.settings import TrainerSettings
from lodestar_trainer.wiring import create_trainer
from tests.e2e.train_cli import call_starts, run_train

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart" / "quickstart.toml"
STEPS = 30
"""As shipped. The take-off (0.1-0.4 -> 0.95) came at step 6, 7, 8, 9, 12 and 15 in six runs. Once the reward
saturates at 1.0 most groups have no signal: the quickstart's trainer stops after 16 of them in a row
(`stop_after_no_signal_groups`), and `lodestar train` ends with "no signal left" and says why (exit 0). Before
that setting the run went on sampling its other tasks for nothing until they were used up ("run used up", after
steps 11, 13 and 16; in one CI run 13 of the test's 16 minutes came after the last step). The take-off came at
step 4 at the earliest in a dozen runs, and a policy saturated by it can end the training one step later, so only
3 steps are required: what proves the learning is the final policy's reward against the initial one's, below."""
MIN_STEPS = 3
TIMEOUT_S = 1500
MIN_SESSIONS = 32
"""Sessions (four groups) a policy version must have sampled for its mean reward to count."""
PUSH_GRACE_S = 10.0
"""Seconds after a step's metrics record within which inference has switched to its version."""
LIVE_S = 15.0
"""A version that stayed the newest this long has had sessions reach their calls under it."""


def _config(tmp_path: Path) -> Path:
    """The quickstart's config with this test's directories and step count; everything else as shipped."""
    text = QUICKSTART.read_text()
    train = tomllib.loads(text)["train"]
    text = text.replace(f'spec = "{train["spec"]}"', f'spec = "{QUICKSTART.parent / train["spec"]}"')
    text = re.sub(r"(?m)^steps = \d+", f"steps = {STEPS}", text)
    text = text.replace(f'run_dir = "{train["run_dir"]}"', f'run_dir = "{tmp_path / "runs"}"\nattach = "never"')
    text = text.replace(f'data_dir = "{train["data_dir"]}"', f'data_dir = "{tmp_path / "stack"}"')
    config = tmp_path / "quickstart.toml"
    config.write_text(text)
    assert tomllib.loads(text)["train"]["steps"] == STEPS
    return config


def _reward_by_version(store: Path, run_id: str) -> dict[int, tuple[int, float]]:
    """Counted sessions sampled by one policy version alone: version -> (sessions, mean reward)."""
    with sqlite3.connect(store) as db:
        rows = db.execute(
            "SELECT min_policy_version, COUNT(*), AVG(reward) FROM sessions WHERE run_id = ? AND counted = 1 "
            "AND min_policy_version = max_policy_version GROUP BY min_policy_version",
            (run_id,),
        ).fetchall()
    return {version: (count, mean) for version, count, mean in rows}


@pytest.mark.timeout(TIMEOUT_S + 180)
def test_the_quickstart_learns(tmp_path: Path) -> None:
    config = _config(tmp_path)
    returncode, output = run_train(config, tmp_path, TIMEOUT_S)
    assert returncode == 0, output[-6000:]
    assert "reward rise" in output, output[-3000:]
    assert "reward.png" in output, output[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run_id = run_dir.name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = len(records)
    assert MIN_STEPS <= steps <= STEPS, output[-3000:]
    if steps < STEPS:
        assert re.search(r"lodestar train: (no signal left|run used up)", output), output[-3000:]
        assert " ended " in output, output[-3000:]  # the summary row saying why

    assert [r["step"] for r in records] == list(range(1, steps + 1))
    # Before any update the trainer recomputes the sampled distribution exactly (fp32; the run's policy).
    assert records[0]["logprob_diff_mean"] <= 1e-4, records[0]
    # The gap the view shows is the same-version mismatch at every step; stale samples' drift is apart.
    assert all(r.get("logprob_diff_max", 0.0) <= 1e-4 for r in records), records
    assert all("policy_drift_mean" in r for r in records if r["staleness_max"] > 0), records
    rewards = [r["reward_mean"] for r in records]
    assert reward_rise(rewards) > 0, rewards
    by_version = _reward_by_version(tmp_path / "stack" / "rollout.sqlite", run_id)
    final = max(version for version, (count, _) in by_version.items() if count >= MIN_SESSIONS)
    assert by_version[0][0] >= MIN_SESSIONS, by_version
    assert final >= steps - 3, (final, by_version)  # one of the run's last policies, not an early one
    assert by_version[final][1] - by_version[0][1] >= 0.3, (by_version, rewards)
    # Every step pushed a new version, and calls captured after it report it: a call that started PUSH_GRACE_S
    # after step k's record reports version k or later, and every version that stayed the newest for LIVE_S
    # has calls. (A version can live shorter than a session takes to reach its call: a step on groups that
    # were already complete follows the one before it at once; no call can report such a version.)
    assert [r["policy_version"] for r in records] == list(range(1, steps + 1))
    pushed = [r["time"] for r in records]
    calls = call_starts(tmp_path / "stack" / "rollout.sqlite", run_id)
    stale = [(t, v) for t, v in calls if v < sum(p + PUSH_GRACE_S < t for p in pushed)]
    assert not stale, (stale[:5], pushed)
    versions = {v for _, v in calls}
    lived = [0] + [k for k in range(1, steps) if pushed[k] - pushed[k - 1] >= LIVE_S]
    assert set(lived) <= versions, (sorted(versions), lived)
    assert max(versions) >= steps - 3, sorted(versions)
    # Prefix merging: each session's two calls became one sequence.
    assert all(r["merge_ratio"] > 1.0 for r in records), [r["merge_ratio"] for r in records]
    assert (run_dir / "reward.png").stat().st_size > 0

    checkpoint = run_dir / "checkpoints" / f"step-{steps:06d}"
    settings = TrainerSettings(run=run_id, resume=checkpoint, run_dir=tmp_path / "resumed", inference="")
    trainer = create_trainer(settings, connect=False)
    assert (trainer.state.step, trainer.state.policy_version) == (steps, steps)
    assert trainer.state.groups_read >= steps * tomllib.loads(config.read_text())["trainer"]["batch"]["groups_per_step"]
    saved = load_file(str(checkpoint / "model.safetensors"))
    for name, parameter in trainer.model.state_dict().items():
        if name in saved:
            assert torch.equal(parameter, saved[name]), name
