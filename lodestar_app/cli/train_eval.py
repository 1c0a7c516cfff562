"""Held-out evaluation around a `lodestar train` run: the `[eval]` table (train_config.EvalConfig).

With an `[eval]` table, `lodestar train` scores the policy it starts from (before the training run is
created, so nothing else competes for the node's slots) and the policy it ends with (after the trainer's
last step is checkpointed, the training run cancelled and every inference replica serves the final
version) on the held-out tasks. Each evaluation is an ordinary `lodestar eval` run (lodestar_app/cli/eval.py):
the same gateway node, harness, verifier and sampling policy as training, `samples` per task, scored by
services/rollout/lodestar_rollout/evaluation.py (pass@1 with its 95% interval, mean reward). The result goes to
`<run dir>/eval.json`, into the summary as a before/after table, and onto reward.png (lodestar_trainer/plot.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc.aio
from rich.console import Console
from rich.table import Table

from lodestar.errors import DeadlineExceededError, LodestarError
from lodestar.etcd import EtcdClient
from lodestar.grpc.client import split_targets
from lodestar.grpc.security import current
from lodestar.inference_registry import list_replicas
from lodestar.presence import DEFAULT_PREFIX
from lodestar.v1 import inference_pb2, inference_pb2_grpc, rollout_pb2
from lodestar_app.cli.eval import eval_spec, evaluate_runs, with_tasks
from lodestar_app.cli.train_config import EvalConfig

if TYPE_CHECKING:
    from lodestar_rollout.evaluation import HarnessScore

EVAL_FILE = "eval.json"
"""The before/after scores in the run directory (read by plot_run)."""


def heldout_spec(train_spec: rollout_pb2.RunSpec, config: EvalConfig) -> rollout_pb2.RunSpec:
    """The evaluation run's spec: the training spec with the held-out tasks (a JSONL), or a spec file of its
    own; `samples` per task, every sample waited for."""
    from lodestar_rollout.spec import load_spec_file

    if config.tasks.suffix == ".jsonl":
        base = with_tasks(train_spec, config.tasks)
        base.name = f"{train_spec.name}-heldout" if train_spec.name else "heldout"
    else:
        base = load_spec_file(config.tasks)
    return eval_spec(base, base.harness.kind, config.samples)


async def evaluate(rollout: str, spec: rollout_pb2.RunSpec, config: EvalConfig, console: Console) -> HarnessScore:
    """One evaluation run of `spec` on the rollout at `rollout`, scored."""
    scores = await evaluate_runs(
        rollout,
        {spec.harness.kind: spec},
        samples=config.samples,
        timeout_s=config.timeout_s,
        pass_threshold=config.pass_threshold,
        console=console,
    )
    return scores[0]


async def wait_for_version(
    inference: str, version: int, timeout_s: float = 300.0, *, etcd: str = "", etcd_prefix: str = DEFAULT_PREFIX
) -> None:
    """Until every inference replica serves `version` or a newer one: the comma-separated addresses of
    `inference`, or with `etcd` the replicas registered there at each look (a replica that died leaves the
    set a lease TTL later instead of holding the evaluation up until the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        targets = await _registered(etcd, etcd_prefix) if etcd else split_targets(inference)
        behind = [target for target in targets if not await _serves(target, version)]
        if targets and not behind:
            return
        if time.monotonic() > deadline:
            raise DeadlineExceededError(f"inference {behind or 'replicas'} do not serve policy version {version}")
        await asyncio.sleep(0.5)


async def _serves(target: str, version: int) -> bool:
    async with current().aio_channel(target) as channel:
        try:
            reply = await inference_pb2_grpc.InferenceServiceStub(channel).GetModelInfo(
                inference_pb2.GetModelInfoRequest(), timeout=10.0
            )
        except grpc.aio.AioRpcError:
            return False  # a replica still swapping weights may not answer at once
    return reply.policy_version.version >= version


async def _registered(etcd: str, prefix: str) -> list[str]:
    try:
        async with EtcdClient(etcd) as client:
            replicas, _ = await list_replicas(client, prefix)
    except LodestarError:
        return []
    return sorted({replica.record.address for replica in replicas.values()})


def write(run_dir: Path, before: HarnessScore | None, after: HarnessScore | None, steps: int) -> Path:
    """`<run_dir>/eval.json`: both scores (per-task details left out) and the step the final one is at."""

    def brief(result: HarnessScore | None) -> dict[str, Any] | None:
        if result is None:
            return None
        return {key: value for key, value in result.as_dict().items() if key != "per_task"}

    path = run_dir / EVAL_FILE
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"before": brief(before), "after": brief(after), "after_step": steps}, indent=2) + "\n")
    return path


def table(before: HarnessScore | None, after: HarnessScore | None) -> Table:
    """The before/after table of the summary."""
    shown = [(label, s) for label, s in (("before", before), ("after", after)) if s is not None]
    first = shown[0][1]
    title = f"held-out evaluation: {first.tasks} tasks x {first.k} samples"
    result = Table(title=title, show_edge=False)
    for column in ("policy", "versions", "samples", "passed", "pass@1", "95% interval", "reward mean", "unscored"):
        result.add_column(column, justify="left" if column == "policy" else "right")
    for label, s in shown:
        versions = ",".join(f"v{v}" for v in s.policy_versions) or "-"
        result.add_row(
            label,
            versions,
            str(s.samples),
            str(s.passed),
            f"{s.pass_at_1:.3f}",
            f"{s.pass_at_1_low:.3f}-{s.pass_at_1_high:.3f}",
            f"{s.reward_mean:.3f}",
            str(s.unscored_tasks),
        )
    return result


def verdict(before: HarnessScore | None, after: HarnessScore | None) -> str:
    """One line: the change in pass@1, and whether the 95% intervals overlap."""
    if before is None or after is None:
        return ""
    change = after.pass_at_1 - before.pass_at_1
    apart = after.pass_at_1_low > before.pass_at_1_high or after.pass_at_1_high < before.pass_at_1_low
    return f"held-out pass@1 {before.pass_at_1:.3f} -> {after.pass_at_1:.3f} ({change * 100:+.1f} points); " + (
        "the 95% intervals do not overlap" if apart else "the 95% intervals overlap: not a clear change"
    )
