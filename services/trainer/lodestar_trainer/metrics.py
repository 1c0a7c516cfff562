"""Per-step metrics: one JSON line per step in `<run_dir>/metrics.jsonl` and TensorBoard scalars.

Every step's values are a flat name -> float map (the same names in the JSONL, in TensorBoard under
`train/<name>`, and in TrainerService's StepMetrics.values). The names the loop writes:

- rewards: `reward_mean`, `reward_std`, `pass_rate` (reward >= pass_threshold; absent when no threshold is
  set and the verifier has given partial credit: see TrainerSettings.pass_threshold) over every scored session of
  the groups the step read (also those without signal, which are not trained on: as GRPO implementations log
  it, so a policy whose groups saturate shows its reward), `reward_mean_trained` (the trained groups only),
  `groups`, `samples` (trained);
- work: `calls`, `call_tokens` (prompt + sampled tokens over all calls: per-request work),
  `tokens_trained` (tokens in the built sequences), `merge_ratio` = call_tokens / tokens_trained,
  `target_tokens` (tokens with loss), `sequences`, `micro_batches`, `merges`, `breaks`;
- splitting (lodestar_trainer/data/split.py): `split_sequences` (sequences longer than micro_batch_tokens cut into
  parts), `split_parts` (the parts they became), `recomputed_tokens` (context computed again: the extra work,
  not in tokens_trained), `over_budget_parts` (parts over the budget: a path from the root is longer);
- loss: `loss`, `clip_fraction`, `kl`, `grad_norm`, `lr`;
- training-inference mismatch (|trainer - inference| logprob) on the tokens sampled by the policy version the step
  updates: `logprob_diff_mean`, `logprob_diff_max`, and by harness `logprob_diff_mean/<harness>`,
  `logprob_diff_max/<harness>` (absent in a step whose tokens are all stale); non-zero beyond float noise is a bug
  (services/trainer/lodestar_trainer/step/mismatch.py);
- policy drift on the stale tokens (sampled by an older version): `policy_drift_mean`, `policy_drift_max`, the
  same |trainer - inference|, which the updates since sampling explain (absent when no token is stale);
- time (seconds): `time_build`, `time_forward_backward`, `time_optimizer`, `time_push`, `time_step`, and
  `tokens_per_second` (tokens_trained / time_forward_backward);
- memory (MB): `memory_peak_mb`, the trainer process's peak resident memory since it started (Linux ru_maxrss:
  weights, gradients, optimizer state, activations, all on the host on CPU), and on CUDA `cuda_memory_peak_mb`,
  the peak of tensors allocated on the process's GPU;
- staleness: `staleness_mean`, `staleness_max` (policy versions between sampling and this update);
- counters since start: `groups_no_signal` (all-equal rewards, dropped), `sessions_dropped` (unscored).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


@dataclass(frozen=True)
class StepRecord:
    step: int
    policy_version: int
    values: dict[str, float]
    time: float = field(default_factory=time.time)
    """Unix time the step finished."""

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "policy_version": self.policy_version, "time": self.time, **self.values})


class MetricsWriter:
    """Appends StepRecords to metrics.jsonl and to TensorBoard event files under `run_dir`."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")
        self._tensorboard: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # heavy import: only when writing

            self._tensorboard = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR))

    def write(self, record: StepRecord) -> None:
        self._file.write(record.to_json() + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name, value in record.values.items():
                self._tensorboard.add_scalar(f"train/{name}", value, record.step, walltime=record.time)
            self._tensorboard.flush()

    def close(self) -> None:
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()


def read_metrics(run_dir: Path) -> Iterator[StepRecord]:
    """The records of `<run_dir>/metrics.jsonl`, in file order (a resumed run appends to the same file)."""
    with (run_dir / METRICS_FILE).open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            document: dict[str, Any] = json.loads(line)
            step = int(document.pop("step"))
            version = int(document.pop("policy_version"))
            stamp = float(document.pop("time"))
            yield StepRecord(step, version, {key: float(value) for key, value in document.items()}, stamp)


def mean_std(values: list[float]) -> tuple[float, float]:
    items = list(values)
    if not items:
        return 0.0, 0.0
    mean = sum(items) / len(items)
    return mean, (sum((value - mean) ** 2 for value in items) / len(items)) ** 0.5
