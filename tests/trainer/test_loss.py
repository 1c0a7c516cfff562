"""The GRPO loss: clipping with separate bounds, aggregation, exact micro-batch summation, TIS, KL, metrics."""

from __future__ import annotations

import math

import pytest
import torch

from lodestar_trainer.data.batch import MicroBatch, TrainingSequence
from lodestar_trainer.data.pack import pack
from lodestar_trainer.step.loss import Aggregation, LossConfig, LossNormalizer, policy_loss


def _batch(samples: list[int], behaviour: list[float], advantages: list[float]) -> MicroBatch:
    size = len(samples) + 1
    sequence = TrainingSequence(
        token_ids=[0] * size,
        parents=list(range(-1, size - 1)),
        position_ids=list(range(size)),
        target_tokens=list(range(1, size)),
        target_samples=samples,
        behaviour_logprobs=behaviour,
        advantages=advantages,
    )
    (batch,) = pack([sequence], token_budget=size)
    return batch


def _grad(new: list[float], batch: MicroBatch, config: LossConfig, **kwargs: torch.Tensor) -> tuple[float, list[float]]:
    logprobs = torch.tensor(new, requires_grad=True)
    out = policy_loss(logprobs, batch, config, LossNormalizer.of([batch]), **kwargs)
    out.loss.backward()
    assert logprobs.grad is not None
    return float(out.loss.detach()), logprobs.grad.tolist()


def test_on_policy_token_loss_is_minus_mean_advantage() -> None:
    batch = _batch([0, 0, 1, 1], [-1.0, -2.0, -0.5, -3.0], [1.0, 1.0, -0.5, -0.5])
    loss, grad = _grad(batch.behaviour_logprobs, batch, LossConfig())
    assert loss == pytest.approx(-(1 + 1 - 0.5 - 0.5) / 4)
    assert grad == pytest.approx([-0.25, -0.25, 0.125, 0.125])


def test_clip_bounds_are_separate_and_stop_the_gradient() -> None:
    config = LossConfig(clip_low=0.2, clip_high=0.28)
    batch = _batch([0, 0, 0, 0], [0.0] * 4, [1.0, 1.0, -1.0, -1.0])
    new = [math.log(1.25), math.log(1.3), math.log(0.85), math.log(0.75)]
    _, grad = _grad(new, batch, config)
    # A>0: 1.25 is inside 1 + 0.28 (gradient), 1.3 is past it (clipped). A<0: 0.85 inside, 0.75 past 1 - 0.2.
    assert grad[0] == pytest.approx(-1.25 / 4)
    assert grad[1] == 0.0
    assert grad[2] == pytest.approx(0.85 / 4)
    assert grad[3] == 0.0
    out = policy_loss(torch.tensor(new), batch, config, LossNormalizer.of([batch]))
    assert out.clipped == 2
    assert out.summary()["clip_fraction"] == 0.5
    assert out.summary()["ratio_mean"] == pytest.approx((1.25 + 1.3 + 0.85 + 0.75) / 4)


def test_sequence_mean_weighs_samples_equally() -> None:
    batch = _batch([0, 1, 1, 1], [0.0] * 4, [1.0] * 4)
    _, grad = _grad([0.0] * 4, batch, LossConfig(aggregation=Aggregation.SEQUENCE_MEAN))
    assert grad == pytest.approx([-0.5, -1 / 6, -1 / 6, -1 / 6])


@pytest.mark.parametrize("aggregation", list(Aggregation))
def test_micro_batch_losses_sum_to_the_step_loss(aggregation: Aggregation) -> None:
    config = LossConfig(aggregation=aggregation, kl_coef=0.1)
    samples, behaviour, advantages = (
        [0, 0, 1, 2, 2, 2],
        [-1.0, -0.7, -2.0, -0.2, -1.1, -0.4],
        [1.0, 1.0, -2.0, 0.5, 0.5, 0.5],
    )
    new = torch.tensor([-0.9, -0.8, -1.5, -0.3, -1.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -1.0, -0.2, -0.9, -0.6])
    whole = _batch(samples, behaviour, advantages)
    whole_loss = policy_loss(new, whole, config, LossNormalizer.of([whole]), ref_logprobs=ref).loss
    first, second = (
        _batch(samples[:3], behaviour[:3], advantages[:3]),
        _batch(samples[3:], behaviour[3:], advantages[3:]),
    )
    norm = LossNormalizer.of([first, second])
    parts = [
        policy_loss(new[:3], first, config, norm, ref_logprobs=ref[:3]),
        policy_loss(new[3:], second, config, norm, ref_logprobs=ref[3:]),
    ]
    # The same six float32 products per_token_i * w_i summed in two orders (3 + 3, then one add, against 6): each
    # sum is within gamma_n * S of the exact one (gamma_n = n * u, u = 2^-24; S = sum |per_token_i * w_i|), so the
    # two differ by <= (gamma_6 + gamma_4) * S. Here |per_token_i| <= |A_i| * e^0.5 + kl_coef * (e^0.5 - 1.5)
    # (|new - behaviour| and |ref - new| <= 0.5) and w_i <= 1/3: S <= 3.1, bound 1.8e-6. One ulp of a loss in
    # [1, 2) is already 1.2e-7 (the former abs=1e-7 was below it); a dropped token moves the loss by >= 4e-2.
    terms = sum(abs(a) * math.exp(0.5) + 0.1 * (math.exp(0.5) - 1.5) for a in advantages) / 3
    bound = 10 * 2.0**-24 * terms
    assert float(parts[0].loss + parts[1].loss) == pytest.approx(float(whole_loss), abs=bound)
    assert parts[0].merge(parts[1]).targets == 6


def test_truncated_importance_weight_against_the_behaviour_policy() -> None:
    batch = _batch([0, 0], [-1.0, -1.0], [1.0, 1.0])
    old = torch.tensor([-1.0 + math.log(1.5), -1.0 + math.log(5.0)])
    _, grad = _grad(old.tolist(), batch, LossConfig(tis_cap=2.0), old_logprobs=old)
    assert grad == pytest.approx([-1.5 / 2, -2.0 / 2])  # ratio 1 against old, weights 1.5 and the cap 2
    out = policy_loss(old.clone(), batch, LossConfig(tis_cap=2.0), LossNormalizer.of([batch]), old_logprobs=old)
    assert out.tis_clipped == 1
    assert out.summary()["mismatch_max"] == pytest.approx(math.log(5.0), rel=1e-6)
    _, uncorrected = _grad(old.tolist(), batch, LossConfig(tis_cap=None), old_logprobs=old)
    assert uncorrected == pytest.approx([-0.5, -0.5])


def test_k3_kl_to_the_reference() -> None:
    batch = _batch([0, 0], [-1.0, -1.0], [0.0, 0.0])
    config = LossConfig(kl_coef=0.5)
    same = policy_loss(
        torch.tensor([-1.0, -2.0]), batch, config, LossNormalizer.of([batch]), ref_logprobs=torch.tensor([-1.0, -2.0])
    )
    assert float(same.loss) == 0.0
    assert same.summary()["kl"] == 0.0
    loss, grad = _grad([-1.0, -1.0], batch, config, ref_logprobs=torch.tensor([-1.5, -0.5]))
    k3 = [math.exp(d) - d - 1 for d in (-0.5, 0.5)]
    assert loss == pytest.approx(0.5 * sum(k3) / 2)
    assert grad == pytest.approx([0.5 * (1 - math.exp(d)) / 2 for d in (-0.5, 0.5)])


def test_mismatch_metrics_merge_across_micro_batches() -> None:
    first, second = _batch([0], [-1.0], [1.0]), _batch([1, 1], [-2.0, -3.0], [1.0, 1.0])
    norm = LossNormalizer.of([first, second])
    a = policy_loss(torch.tensor([-1.1]), first, LossConfig(), norm)
    b = policy_loss(torch.tensor([-2.0, -2.5]), second, LossConfig(), norm)
    summary = a.merge(b).summary()
    assert summary["mismatch_mean"] == pytest.approx((0.1 + 0.0 + 0.5) / 3, rel=1e-5)
    assert summary["mismatch_max"] == pytest.approx(0.5)
    assert summary["targets"] == 3


def test_shape_mismatch_raises() -> None:
    batch = _batch([0, 0], [-1.0, -1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="expected \\(2,\\)"):
        policy_loss(torch.zeros(3), batch, LossConfig(), LossNormalizer.of([batch]))
