"""The training loop on the tiny model with an in-memory group feed: steps, metrics, dropped groups."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import trainer_pb2
from lodestar_trainer.servicer import status_response
from lodestar_trainer.status import Phase
from lodestar_trainer.wiring import check
from tests.trainer.groups_helpers import RUN, make_group
from tests.trainer.helpers import trainer_for, trainer_settings


def test_steps_update_weights_and_write_metrics(trainer_model_dir: Path, tmp_path: Path) -> None:
    groups = [make_group(0), make_group(1, rewards=(0.5, 0.5, 0.5, 0.5)), make_group(2), make_group(3)]
    trainer, source = trainer_for(trainer_model_dir, tmp_path, groups, steps=2, groups_per_step=1, pass_threshold=1.0)
    before = {name: tensor.clone() for name, tensor in trainer.model.state_dict().items()}

    trainer.run()

    status = trainer.board.snapshot()
    assert status.phase is Phase.STOPPED, status.error
    assert (status.step, status.policy_version) == (2, 2)
    assert source.reported == [1, 2]
    changed = [name for name, tensor in trainer.model.state_dict().items() if not torch.equal(tensor, before[name])]
    assert "lm_head.weight" in changed
    assert any("layers.1" in name for name in changed)
    # group 1 has equal rewards: dropped (counted), so step 2 trained on group 2 and group 3 was not read.
    assert trainer.state.groups_read == 3
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    second = lines[1]
    assert second["groups_no_signal"] == 1.0
    assert second["merge_ratio"] > 1.0
    assert second["call_tokens"] > second["tokens_trained"]
    for key in ("loss", "clip_fraction", "kl", "policy_drift_mean", "policy_drift_max", "reward_mean",
                "reward_std", "pass_rate", "staleness_mean", "time_build", "time_forward_backward",
                "time_optimizer", "time_push", "grad_norm"):  # fmt: skip
        assert key in second, key
    # The step's reward metrics count every scored session it read: group 2 (trained) and group 1 (no signal).
    assert second["pass_rate"] == 0.125
    assert abs(second["reward_mean"] - 3.5 / 8) < 1e-9
    assert abs(second["reward_mean_trained"] - 0.375) < 1e-9
    # Step 2's tokens were sampled by version 0 (the trainer holds 1): their difference is drift, not a gap.
    assert second["policy_drift_max"] >= second["policy_drift_mean"] > 0
    assert "logprob_diff_mean" not in second
    assert any((tmp_path / "run" / "tensorboard").iterdir())


def test_pass_rate_without_a_threshold_only_while_rewards_are_pass_fail(
    trainer_model_dir: Path, tmp_path: Path
) -> None:
    groups = [make_group(0, rewards=(1.0, 0.0, 0.0, 1.0)), make_group(1, rewards=(1.0, 0.0, 0.5, 0.0)), make_group(2)]
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, groups, steps=3, groups_per_step=1)

    trainer.run()

    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert lines[0]["pass_rate"] == 0.5, "a pass/fail verifier: reward 1 passes"
    assert "pass_rate" not in lines[1], "partial credit defines no passing"
    assert "pass_rate" not in lines[2], "not even once the rewards look pass/fail again"


def test_infra_failed_sessions_never_reach_the_loss(trainer_model_dir: Path, tmp_path: Path) -> None:
    from lodestar.v1 import rollout_pb2

    failed = rollout_pb2.SESSION_OUTCOME_INFRA_FAILED
    scored = rollout_pb2.SESSION_OUTCOME_SCORED
    group = make_group(4, rewards=(1.0, 0.0, 0.0, 1.0), outcomes=(scored, failed, scored, failed))
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [group], steps=1)
    trainer.run()
    record = trainer.board.snapshot().last_record
    assert record is not None, trainer.board.snapshot().error
    assert record.values["samples"] == 2
    assert record.values["sessions_dropped"] == 2
    assert record.values["reward_mean"] == 0.5


def test_bfloat16_computes_in_bf16_and_steps_fp32_master_weights(trainer_model_dir: Path, tmp_path: Path) -> None:
    # lr 1e-6: a pure-bf16 AdamW step would round almost every update away (bf16 keeps 8 significant bits).
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [make_group(0)], steps=1, dtype="bfloat16", lr=1e-6)
    assert trainer.compute is not None
    before = trainer.model.lm_head.weight.detach().clone()
    trainer.run()
    record = trainer.board.snapshot().last_record
    assert record is not None, trainer.board.snapshot().error
    master, copy = trainer.model.lm_head.weight, trainer.compute.model.lm_head.weight
    assert (master.dtype, copy.dtype) == (torch.float32, torch.bfloat16)
    moved = (master.detach() - before).abs()
    assert float(moved.detach().max()) < 2e-6  # ~lr per element
    assert float((moved.detach() > 0).float().mean()) > 0.9  # nearly every weight moved
    assert torch.equal(copy, master.to(torch.bfloat16))
    assert math.isfinite(record.values["loss"])


def test_kl_to_the_starting_model_and_truncated_importance_sampling(trainer_model_dir: Path, tmp_path: Path) -> None:
    groups = [make_group(0), make_group(1)]
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, groups, steps=2, kl_coef=0.1, behaviour_correction="tis")
    assert trainer.reference is not None
    trainer.run()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2, trainer.board.snapshot().error
    assert lines[0]["kl"] == 0.0  # step 1: the policy is still the reference
    assert lines[1]["kl"] > 0.0
    # tis: the ratio is against the trainer's own pre-step logprobs, so it is 1 and nothing is clipped; the
    # captured logprobs (~-8.3 vs the model's own) are far off, so every importance weight hits the cap.
    assert lines[1]["ratio_mean"] == 1.0
    assert lines[1]["clip_fraction"] == 0.0
    assert lines[1]["tis_clip_fraction"] > 0.0


def test_groups_staler_than_the_trainers_bound_are_dropped_when_taken(trainer_model_dir: Path, tmp_path: Path) -> None:
    """The stream reads ahead while a step runs, so a group may arrive older than rollout's bound: the trainer
    drops it against its own version (max_staleness=0: only groups sampled by the current policy train)."""
    fresh, old, fresh_again = make_group(0), make_group(1), make_group(2)
    old.min_policy_version = 0  # sampled by version 0, taken after step 1 (version 1): one behind
    fresh_again.min_policy_version = 1
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [fresh, old, fresh_again], steps=2, max_staleness=0)

    trainer.run()

    status = trainer.board.snapshot()
    assert status.phase is Phase.STOPPED, status.error
    assert (status.step, trainer.state.groups_read) == (2, 3)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["groups_stale"] for line in lines] == [0.0, 1.0]


def test_without_a_trainer_bound_stale_groups_train(trainer_model_dir: Path, tmp_path: Path) -> None:
    old = make_group(1)
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [make_group(0), old], steps=2)

    trainer.run()

    assert (trainer.board.snapshot().step, trainer.state.groups_read) == (2, 2)


def test_a_run_used_up_mid_step_logs_what_its_untrained_groups_scored(trainer_model_dir: Path, tmp_path: Path) -> None:
    import structlog

    groups = [make_group(0), make_group(1, rewards=(1.0,) * 4), make_group(2, rewards=(0.5,) * 4)]
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, groups, steps=3, groups_per_step=1)
    with structlog.testing.capture_logs() as logs:
        trainer.run()
    assert trainer.state.step == 1  # the second step found no group with signal before the run ended
    (ended,) = [entry for entry in logs if entry["event"] == "trainer stopping"]
    assert (ended["reason"], ended["untrained_groups"], ended["untrained_reward_mean"]) == ("run_ended", 2, 0.75)
    status = status_response(trainer.board.snapshot())  # GetStatus
    assert (status.untrained_groups, status.untrained_reward_mean) == (2, 0.75)
    assert status.stop_reason == trainer_pb2.STOP_REASON_RUN_ENDED


def test_groups_without_signal_in_a_row_stop_the_trainer(trainer_model_dir: Path, tmp_path: Path) -> None:
    """stop_after_no_signal_groups=3 with two groups per step: a group with signal breaks the count (the first
    step reads two without, one with, two without, one with), then three without in a row stop the trainer
    before the run's last group is read."""
    solved = [make_group(index, rewards=(1.0,) * 4) for index in range(10, 17)]
    groups = [*solved[:2], make_group(0), *solved[2:4], make_group(1), *solved[4:], make_group(2)]
    trainer, _ = trainer_for(
        trainer_model_dir, tmp_path, groups, steps=5, groups_per_step=2, stop_after_no_signal_groups=3
    )

    trainer.run()

    status = trainer.board.snapshot()
    assert status.phase is Phase.STOPPED, status.error
    assert (status.step, trainer.state.groups_read) == (1, 6)  # the stopping plan's groups are not consumed
    reply = status_response(status)
    assert reply.state == trainer_pb2.TRAINER_STATE_STOPPED
    assert reply.stop_reason == trainer_pb2.STOP_REASON_NO_SIGNAL
    assert (reply.untrained_groups, reply.untrained_reward_mean) == (3, 1.0)


def test_steps_done_is_the_stop_reason_after_the_last_step(trainer_model_dir: Path, tmp_path: Path) -> None:
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [make_group(0), make_group(1)], steps=1)
    trainer.run()
    assert status_response(trainer.board.snapshot()).stop_reason == trainer_pb2.STOP_REASON_STEPS_DONE


def test_a_negative_no_signal_limit_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="stop_after_no_signal_groups"):
        check(trainer_settings(run=RUN, model=Path("m"), stop_after_no_signal_groups=-1))
