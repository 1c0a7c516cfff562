"""The metric values of one step (names documented in lodestar_trainer/metrics.py), from what the loop saw,
and the loss metrics of all ranks combined."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from lodestar_trainer.data.batch import BuildStats
from lodestar_trainer.data.groups import GroupSamples
from lodestar_trainer.data.split import SplitStats
from lodestar_trainer.metrics import mean_std
from lodestar_trainer.parallel.distributed import Parallel
from lodestar_trainer.step.loss import LossOutput


def step_values(
    *,
    groups: Sequence[GroupSamples],
    no_signal_rewards: Sequence[float] = (),
    stats: BuildStats,
    split: SplitStats | None = None,
    micro_batches: int,
    loss: LossOutput | None,
    grad_norm: float,
    lr: float,
    seconds: Mapping[str, float],
    version_before: int,
    pass_threshold: float | None,
    counters: Mapping[str, float],
    push_bytes: int = 0,
) -> dict[str, float]:
    split = split or SplitStats()
    trained = [reward for group in groups for reward in group.rewards]
    rewards = [*trained, *no_signal_rewards]  # every scored session read, as GRPO logs its reward
    reward_mean, reward_std = mean_std(rewards)
    staleness = [float(version_before - group.min_policy_version) for group in groups]
    values: dict[str, float] = {
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "reward_mean_trained": mean_std(trained)[0],
        "groups": float(len(groups)),
        "samples": float(sum(len(group.samples) for group in groups)),
        "calls": float(stats.calls),
        "call_tokens": float(stats.call_tokens),
        "tokens_trained": float(stats.sequence_tokens),
        "merge_ratio": stats.token_ratio,
        "sequences": float(stats.sequences),
        "micro_batches": float(micro_batches),
        "merges": float(stats.merges),
        "breaks": float(stats.breaks),
        "split_sequences": float(split.split_sequences),
        "split_parts": float(split.parts),
        "recomputed_tokens": float(split.recomputed_tokens),
        "over_budget_parts": float(split.over_budget_parts),
        "grad_norm": grad_norm,
        "lr": lr,
        "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "staleness_max": max(staleness, default=0.0),
        "push_bytes": float(push_bytes),
        **seconds,
        **counters,
    }
    if pass_threshold is not None:
        values["pass_rate"] = sum(reward >= pass_threshold for reward in rewards) / len(rewards) if rewards else 0.0
    values["time_step"] = sum(seconds.values())
    forward_backward = seconds.get("time_forward_backward", 0.0)
    values["tokens_per_second"] = stats.sequence_tokens / forward_backward if forward_backward > 0 else 0.0
    if loss is not None:
        summary = loss.summary()
        values.update(
            loss=summary["loss"],
            target_tokens=summary["targets"],
            clip_fraction=summary["clip_fraction"],
            ratio_mean=summary["ratio_mean"],
            kl=summary["kl"],
            tis_clip_fraction=summary["tis_clip_fraction"],
        )
    return values


def loss_over_ranks(parallel: Parallel, totals: LossOutput | None) -> LossOutput | None:
    """The loss metrics summed (clip counts, sums) and maxed (mismatch) over every rank's micro-batches."""
    if not parallel.distributed or totals is None:
        return totals
    summed = parallel.sum(
        [
            float(totals.loss.detach()),
            totals.targets,
            totals.clipped,
            totals.ratio_sum,
            totals.kl_sum,
            totals.mismatch_abs_sum,
            totals.tis_clipped,
        ]
    )
    (largest,) = parallel.max([totals.mismatch_abs_max])
    return LossOutput(
        loss=torch.tensor(summed[0]),
        targets=int(summed[1]),
        clipped=int(summed[2]),
        ratio_sum=summed[3],
        kl_sum=summed[4],
        mismatch_abs_sum=summed[5],
        mismatch_abs_max=largest,
        tis_clipped=int(summed[6]),
    )
