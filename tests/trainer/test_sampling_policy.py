"""The trainer trains on the distribution that was sampled: each call's recorded temperature scales its targets'
logits (all three builders, the chunked log-softmax and its gradient), untrainable sampling (top_p < 1,
top_k > 0, greedy) is refused by name, and the trainer-vs-inference mismatch is reported per harness with a
warning above the threshold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lodestar.v1 import common_pb2, rollout_pb2
from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.groups import BadGroupError, group_samples
from lodestar_trainer.data.pack import pack
from lodestar_trainer.data.synthetic import SMALL_SHAPE, synthetic_samples
from lodestar_trainer.status import Phase
from lodestar_trainer.step.advantages import AdvantageKind
from lodestar_trainer.step.forward import chunked_target_logprobs, target_logprobs
from tests.trainer.groups_helpers import RUN, make_group
from tests.trainer.helpers import target_path, trainer_for


def test_chunked_log_softmax_at_per_row_temperatures_equals_the_full_one() -> None:
    torch.manual_seed(3)
    rows, vocab = 29, 300
    hidden = torch.randn(rows, 12, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, 12, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,))
    temperatures = torch.rand(rows, dtype=torch.float64) * 1.7 + 0.3
    got = chunked_target_logprobs(
        hidden, weight, targets, bias=bias, temperatures=temperatures, vocab_chunk=64, row_chunk=8
    )
    full = torch.log_softmax((hidden @ weight.T + bias) / temperatures[:, None], -1)[torch.arange(rows), targets]
    torch.testing.assert_close(got, full.float())
    at_one = torch.log_softmax(hidden @ weight.T + bias, -1)[torch.arange(rows), targets]
    assert (got.detach() - at_one.detach().float()).abs().mean() > 0.1, "the temperature changes the logprobs"
    grad = torch.randn(rows, dtype=torch.float64)
    got_grads = torch.autograd.grad(got, (hidden, weight, bias), grad.float())
    full_grads = torch.autograd.grad(full, (hidden, weight, bias), grad)
    for chunked, dense in zip(got_grads, full_grads, strict=True):
        torch.testing.assert_close(chunked, dense, atol=1e-5, rtol=1e-4)


def test_temperatures_must_be_positive_and_one_per_row() -> None:
    hidden, weight, targets = torch.randn(3, 4), torch.randn(10, 4), torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="positive"):
        chunked_target_logprobs(hidden, weight, targets, temperatures=torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="3 positive values"):
        chunked_target_logprobs(hidden, weight, targets, temperatures=torch.tensor([1.0, 1.0]))


def _with_temperatures(samples: list[Any]) -> dict[int, float]:
    """Give each sample's calls their own temperature (0.6, 1.0, 1.4, ...); {sample index: temperature}."""
    chosen = {}
    for index, sample in enumerate(samples):
        temperature = (0.6, 1.0, 1.4)[index % 3]
        chosen[sample.sample_index] = temperature
        for call in sample.calls:
            call.sampling.temperature = temperature
            call.sampling.top_p = 1.0
            call.sampling.top_k = 0
    return chosen


@pytest.mark.parametrize("kind", list(BuilderKind))
def test_target_logprobs_use_the_temperature_each_call_was_sampled_at(tiny_lm: Any, kind: BuilderKind) -> None:
    samples = synthetic_samples(SMALL_SHAPE, group_size=3, seed=11)
    temperature_of = _with_temperatures(samples)
    expected = {}
    with torch.no_grad():
        for sample in samples:
            for call in sample.calls:
                ids = [*call.prompt_token_ids, *call.completion_token_ids]
                logits = tiny_lm(torch.tensor([ids])).logits[0].float()
                logprobs = torch.log_softmax(logits / call.sampling.temperature, -1)  # float32, as inference has it
                for index, token in enumerate(call.completion_token_ids):
                    position = len(call.prompt_token_ids) + index
                    expected[(sample.sample_index, tuple(ids[: position + 1]))] = float(logprobs[position - 1, token])
    seen = 0
    for batch in pack(build_sequences(kind, samples).sequences, token_budget=256):
        assert len(batch.temperatures) == len(batch.target_tokens)
        got = target_logprobs(tiny_lm, batch, vocab_chunk=1000, attention_block=32).detach()
        for index in range(len(batch.target_tokens)):
            assert batch.temperatures[index] == pytest.approx(temperature_of[batch.target_samples[index]])
            key = (batch.target_samples[index], target_path(batch, index))
            assert float(got[index]) == pytest.approx(expected[key], abs=2e-5)
            seen += 1
    assert seen == sum(len(call.completion_token_ids) for sample in samples for call in sample.calls)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("top_p", 0.95, "sampled with top_p 0.95, which the trainer cannot recompute"),
        ("top_k", 64, "sampled with top_k 64, which the trainer cannot recompute"),
        ("temperature", 0.0, "decoded greedily"),
    ],
)
def test_calls_sampled_in_a_way_the_trainer_cannot_recompute_are_refused(field: str, value: float, message: str):
    group = make_group(0)
    call = group.sessions[1].calls[0]
    setattr(call.sampling, field, value)
    with pytest.raises(BadGroupError, match=message) as raised:
        group_samples(group, run_id=RUN, advantage=AdvantageKind.ZSCORE)
    assert call.session_id in raised.value.message
    assert "sampling policy" in raised.value.message or field == "temperature"


def test_explicit_untruncated_sampling_is_trainable() -> None:
    group = make_group(0)
    for session in group.sessions:
        for call in session.calls:
            call.sampling.CopyFrom(common_pb2.SamplingParams(temperature=0.8, top_p=1.0, top_k=0))
    samples = group_samples(group, run_id=RUN, advantage=AdvantageKind.ZSCORE)
    assert samples.calls == sum(len(session.calls) for session in group.sessions)


def _by_harness(group: rollout_pb2.Group, harnesses: list[str], shift: dict[str, float]) -> rollout_pb2.Group:
    for session, harness in zip(group.sessions, harnesses, strict=True):
        session.harness = harness
        for call in session.calls:
            call.completion_logprobs[:] = [value + shift.get(harness, 0.0) for value in call.completion_logprobs]
    return group


def test_mismatch_is_reported_per_harness_and_warns_above_the_threshold(trainer_model_dir: Path, tmp_path: Path):
    # Synthetic behaviour logprobs are within ~0.5 nats of the random tiny model's; harness "drifty" is 6 off.
    group = _by_harness(make_group(0), ["steady", "drifty", "steady", "drifty"], {"drifty": -6.0})
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [group], steps=1, mismatch_warn_nats=3.0)

    trainer.run()

    status = trainer.board.snapshot()
    assert status.phase is Phase.STOPPED, status.error
    [line] = [json.loads(text) for text in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steady, drifty = line["logprob_diff_mean/steady"], line["logprob_diff_mean/drifty"]
    assert steady < 3.0 < drifty
    assert drifty > steady + 4.0
    assert line["logprob_diff_max/drifty"] >= drifty
    assert min(steady, drifty) <= line["logprob_diff_mean"] <= max(steady, drifty)
    assert "drifty" in status.warning
    assert "steady" not in status.warning
    assert status.warning.startswith("step 1:")


def test_no_warning_when_every_harness_is_under_the_threshold(trainer_model_dir: Path, tmp_path: Path) -> None:
    group = _by_harness(make_group(0), ["pi"] * 4, {})
    trainer, _ = trainer_for(trainer_model_dir, tmp_path, [group], steps=1, mismatch_warn_nats=3.0)
    trainer.run()
    status = trainer.board.snapshot()
    assert status.phase is Phase.STOPPED, status.error
    assert status.warning == ""
    assert status.last_record is not None
    assert set(status.last_record.values) >= {"logprob_diff_mean/pi", "logprob_diff_max/pi"}


def test_stale_tokens_are_not_a_mismatch(trainer_model_dir: Path, tmp_path: Path) -> None:
    """Step 2 trains on a group version 0 sampled (the trainer holds version 1): its tokens differ by the update,
    which the importance weight corrects, so even 6 nats off they are neither a per-harness mismatch nor a
    warning (step 1's fresh tokens are: the test above)."""
    fresh = _by_harness(make_group(0), ["pi"] * 4, {})
    stale = _by_harness(make_group(1), ["drifty"] * 4, {"drifty": -6.0})
    trainer, _ = trainer_for(
        trainer_model_dir, tmp_path, [fresh, stale], steps=2, groups_per_step=1, mismatch_warn_nats=3.0
    )
    trainer.run()
    status = trainer.board.snapshot()
    assert status.phase is Phase.STOPPED, status.error
    first, second = [json.loads(text) for text in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "logprob_diff_mean/pi" in first
    assert second["policy_version"] == 2
    assert second["policy_drift_mean"] > 3.0, "the stale tokens' difference is drift"
    assert "logprob_diff_mean" not in second, "no same-version token: no gap"
    assert "logprob_diff_mean/drifty" not in second
    assert status.warning == ""
