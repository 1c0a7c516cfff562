"""`lodestar eval TASKS --harness H [--harness H2 ...] [--samples K] [--model DIR]`: pass@1 and pass@k.

No training: for each harness an ordinary run (group size K, early stop off, no staleness drop) goes
through the rollout machinery — real gateway nodes, the real harness binaries, the run's verifier — on the
policy inference serves now. Nobody trains on these runs, so rollout never holds them back. Scores come
from the runs' groups (`StreamGroups`, tokens only); the math is in `services/rollout/lodestar_rollout/evaluation.py`.

- TASKS is a run spec (YAML/JSON, docs/runs.md: its tasks, verifier, timeouts and harness settings are
  used; `--harness` replaces the harness kind, `--samples` the group size) or a tasks JSONL file (then
  `--verifier KIND` and `--verifier-config JSON` give the verifier; default exact_match), or a task-set
  directory holding one of them (`run.yaml` first; e.g. `lodestar eval examples/swe-mini`).
  `--runtime host|docker` and `--image` set the runs' `runtime` (docs/runtimes.md). `--tasks-file JSONL`
  evaluates other tasks under the same spec (e.g. `lodestar eval examples/smollm2-capitals --tasks-file
  examples/smollm2-capitals/heldout.jsonl`: held-out tasks, the training run's harness and verifier).
- `--sampling run` (the default) samples every call under the spec's sampling policy (`sampling`, default
  temperature 1, top_p 1, top_k off: the distribution a training run samples from, so eval and training
  scores compare); `--sampling harness` lets each harness sample as it asks (Gemini CLI: temperature 1,
  top_p 0.95, top_k 64), i.e. the harness as it ships.
- Without `--model` it attaches to a running stack (`--rollout`, default `lodestar up`'s 127.0.0.1:50053)
  and evaluates whatever policy that stack serves, e.g. mid-training. With `--model DIR` it starts its own
  stack (etcd, inference serving DIR, rollout, a gateway node; no trainer) under `--data-dir`, and stops
  it at the end.

Prints a rich table (harness, run, tasks, samples, pass@1 with its 95% interval, pass@K, reward mean) or,
with `--json`, one JSON object per harness in a list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc.aio
from rich.console import Console
from rich.table import Table

from lodestar import kinds
from lodestar.errors import DeadlineExceededError, InvalidArgumentError
from lodestar.grpc.client import LeaderChannel
from lodestar.grpc.errors import error_from_rpc
from lodestar.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from lodestar_app.cli import client_security
from lodestar_app.cli.up import BACKENDS

if TYPE_CHECKING:
    from lodestar_rollout.evaluation import HarnessScore

DEFAULT_ROLLOUT = "127.0.0.1:50053"
_console = Console(stderr=True)


SPEC_NAMES = ("run.yaml", "run.yml", "run.json", "tasks.jsonl")
"""What a task-set directory given as TASKS is read from: the first of these files it has."""


def tasks_path(path: Path) -> Path:
    """TASKS itself, or for a task-set directory (e.g. examples/swe-mini) its run spec or tasks JSONL."""
    if not path.is_dir():
        return path
    found = next((path / name for name in SPEC_NAMES if (path / name).is_file()), None)
    if found is None:
        raise InvalidArgumentError(f"task directory {path} has none of {', '.join(SPEC_NAMES)}")
    return found


def _spec(args: argparse.Namespace) -> rollout_pb2.RunSpec:
    from google.protobuf import json_format

    from lodestar_rollout.spec import load_spec_file, read_tasks_jsonl

    path = tasks_path(args.tasks)
    if path.suffix == ".jsonl":
        spec = rollout_pb2.RunSpec(name=path.parent.name if path.name == "tasks.jsonl" else path.stem, group_size=1)
        spec.tasks.extend(read_tasks_jsonl(path))
        spec.verifier.kind = args.verifier
        if args.verifier_config:
            json_format.ParseDict({"config": json.loads(args.verifier_config)}, spec.verifier)
    else:
        spec = load_spec_file(path)
    if args.tasks_file is not None:
        spec = with_tasks(spec, args.tasks_file)
    if args.runtime:
        spec.runtime.kind = args.runtime
    if args.image:
        spec.runtime.image = args.image
    if args.sampling == "harness":
        spec.sampling.mode = common_pb2.SAMPLING_MODE_HARNESS
    return spec


def with_tasks(spec: rollout_pb2.RunSpec, tasks_file: Path) -> rollout_pb2.RunSpec:
    """A copy of `spec` whose tasks are those of `tasks_file` (JSONL): other tasks, the same harness, verifier
    and sampling policy (held-out tasks of a training run)."""
    from lodestar_rollout.spec import read_tasks_jsonl

    replaced = rollout_pb2.RunSpec()
    replaced.CopyFrom(spec)
    del replaced.tasks[:]
    replaced.tasks.extend(read_tasks_jsonl(tasks_file))
    return replaced


def eval_spec(base: rollout_pb2.RunSpec, harness: str, samples: int) -> rollout_pb2.RunSpec:
    """The run spec evaluating `harness` on `base`'s tasks: K samples per task, all of them waited for."""
    from lodestar_rollout.evaluation import MAX_STALENESS
    from lodestar_rollout.spec import validate_spec

    spec = rollout_pb2.RunSpec()
    spec.CopyFrom(base)
    spec.name = f"eval-{harness}-{base.name}" if base.name else f"eval-{harness}"
    if harness != base.harness.kind:
        spec.harness.CopyFrom(rollout_pb2.HarnessSpec(kind=harness, model=base.harness.model))
    spec.group_size = samples
    spec.early_stop_fraction = 1.0
    spec.max_staleness = MAX_STALENESS
    validate_spec(spec)
    return spec


async def _groups(channel: LeaderChannel, run_id: str, timeout: float) -> list[rollout_pb2.Group]:
    async def collect(ch: grpc.aio.Channel) -> list[rollout_pb2.Group]:
        stub = rollout_pb2_grpc.RolloutServiceStub(ch)
        request = rollout_pb2.StreamGroupsRequest(run_id=run_id, tokens_only=True)
        return [reply.group async for reply in stub.StreamGroups(request, timeout=timeout)]

    return await channel.call(collect)


async def _get_run(channel: LeaderChannel, run_id: str) -> rollout_pb2.Run:
    async def get(ch: grpc.aio.Channel) -> rollout_pb2.Run:
        stub = rollout_pb2_grpc.RolloutServiceStub(ch)
        reply: rollout_pb2.GetRunResponse = await stub.GetRun(rollout_pb2.GetRunRequest(run_id=run_id))
        return reply.run

    return await channel.call(get)


async def _create_run(channel: LeaderChannel, spec: rollout_pb2.RunSpec) -> str:
    async def create(ch: grpc.aio.Channel) -> str:
        stub = rollout_pb2_grpc.RolloutServiceStub(ch)
        reply: rollout_pb2.CreateRunResponse = await stub.CreateRun(rollout_pb2.CreateRunRequest(spec=spec))
        return reply.run.run_id

    return await channel.call(create)


async def _wait(channel: LeaderChannel, run_ids: list[str], deadline: float) -> None:
    pending = set(run_ids)
    while pending:
        for run_id in sorted(pending):
            run = await _get_run(channel, run_id)
            if run.state != rollout_pb2.RUN_STATE_RUNNING:
                pending.discard(run_id)
        if pending and time.monotonic() > deadline:
            raise DeadlineExceededError(f"evaluation runs still running at the timeout: {', '.join(sorted(pending))}")
        if pending:
            await asyncio.sleep(1.0)


@asynccontextmanager
async def _stack(args: argparse.Namespace) -> AsyncIterator[str]:
    """The rollout address to use: the attached one, or a stack of our own serving `--model`."""
    if args.model is None:
        yield args.rollout
        return
    from lodestar_app.cli import up
    from lodestar_app.local import LocalCluster, find_etcd

    data_dir: Path = args.data_dir.resolve()
    cluster = LocalCluster(data_dir, etcd_binary=find_etcd(), max_restarts=0)
    settings = argparse.Namespace(
        backend=args.backend, model=args.model.resolve(), http_port=0, slots=args.slots, ready_buffer=1
    )
    try:
        with _console.status("starting etcd, inference, rollout and a gateway node"):
            await cluster.start_etcd(timeout=args.start_timeout_s)
            specs = [s for s in up._service_specs(settings, data_dir, cluster.etcd_url) if s.name != "trainer"]
            await cluster.start_services(specs, timeout=args.start_timeout_s)
        rollout = next(s for s in specs if s.name == "rollout")
        yield f"127.0.0.1:{rollout.port}"
    finally:
        await cluster.stop()


async def evaluate_runs(
    target: str,
    specs: dict[str, rollout_pb2.RunSpec],
    *,
    samples: int,
    timeout_s: float,
    pass_threshold: float,
    console: Console = _console,
) -> list[HarnessScore]:
    """Create one evaluation run per harness (`eval_spec`s) on the rollout at `target`, wait for all of them
    (DeadlineExceededError after `timeout_s`) and score each from its groups."""
    from lodestar_rollout.evaluation import score

    channel = LeaderChannel(target)
    try:
        runs: dict[str, tuple[str, list[str]]] = {}
        for harness, spec in specs.items():
            runs[harness] = (await _create_run(channel, spec), [task.task_id for task in spec.tasks])
        tasks = max(len(task_ids) for _, task_ids in runs.values())
        with console.status(f"evaluating {', '.join(runs)} ({tasks} tasks x {samples})"):
            await _wait(channel, [run_id for run_id, _ in runs.values()], time.monotonic() + timeout_s)
        scores = []
        for harness, (run_id, task_ids) in runs.items():
            groups = await _groups(channel, run_id, timeout=120.0)
            scores.append(score(harness, run_id, task_ids, groups, k=samples, pass_threshold=pass_threshold))
        return scores
    except grpc.aio.AioRpcError as error:  # rollout unreachable or refusing: a clear error, not a traceback
        raise error_from_rpc(error) from None
    finally:
        await channel.close()


async def _evaluate(args: argparse.Namespace) -> list[dict[str, Any]]:
    base = _spec(args)
    specs = {harness: eval_spec(base, harness, args.samples) for harness in args.harness}
    async with _stack(args) as target:
        scores = await evaluate_runs(
            target, specs, samples=args.samples, timeout_s=args.timeout_s, pass_threshold=args.pass_threshold
        )
    return [s.as_dict() for s in scores]


def _table(results: list[dict[str, Any]], k: int) -> Table:
    table = Table(title="lodestar eval")
    for column in (
        "harness",
        "run",
        "tasks",
        "unscored",
        "samples",
        "passed",
        "pass@1",
        "95% CI",
        f"pass@{k}",
        "reward",
    ):
        table.add_column(column, justify="left" if column in ("harness", "run") else "right")
    for r in results:
        table.add_row(
            r["harness"],
            r["run_id"],
            str(r["tasks"]),
            str(r["unscored_tasks"]),
            str(r["samples"]),
            str(r["passed"]),
            f"{r['pass_at_1']:.3f}",
            f"{r['pass_at_1_low']:.3f}-{r['pass_at_1_high']:.3f}",
            f"{r['pass_at_k']:.3f}",
            f"{r['reward_mean']:.3f}",
        )
    return table


def _handle(args: argparse.Namespace) -> int:
    if args.samples < 1:
        raise InvalidArgumentError("--samples must be at least 1")
    results = asyncio.run(_evaluate(args))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        Console().print(_table(results, args.samples))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `eval` command."""
    command = subparsers.add_parser("eval", help="pass@1 and pass@k of harnesses on a task set (no training)")
    command.add_argument(
        "tasks", type=Path, metavar="TASKS", help="run spec (YAML/JSON), tasks JSONL, or a task-set directory"
    )
    command.add_argument(
        "--harness",
        action="append",
        required=True,
        choices=kinds.harness_kinds(),
        metavar="KIND",
        help=f"harness kind ({', '.join(kinds.HARNESS_KINDS)}, pi:<api>); repeat for several",
    )
    command.add_argument(
        "--tasks-file",
        type=Path,
        default=None,
        metavar="JSONL",
        help="evaluate these tasks instead of the spec's (its harness, verifier and sampling stay), e.g. held-out ones",
    )
    command.add_argument("--samples", type=int, default=4, help="samples per task: K of pass@K (default 4)")
    command.add_argument("--model", type=Path, default=None, help="serve this model on a stack of our own")
    command.add_argument("--rollout", default=DEFAULT_ROLLOUT, metavar="HOST:PORT", help="stack to attach to")
    command.add_argument(
        "--verifier", default="exact_match", choices=kinds.VERIFIER_KINDS, help="verifier kind for a JSONL TASKS file"
    )
    command.add_argument("--verifier-config", default="", help="verifier config (JSON) for a JSONL TASKS file")
    command.add_argument("--runtime", choices=kinds.RUNTIME_KINDS, default=None, help="runtime.kind of the runs")
    command.add_argument("--image", default="", help="runtime.image of the runs (the default session image)")
    command.add_argument(
        "--sampling",
        choices=["run", "harness"],
        default="run",
        help="run: the spec's sampling policy (default temperature 1, as training samples); harness: each "
        "harness samples as it asks (how it ships)",
    )
    command.add_argument("--pass-threshold", type=float, default=1.0, help="a sample passes at reward >= this")
    command.add_argument("--timeout-s", type=float, default=3600.0, help="seconds to wait for the runs (default 3600)")
    command.add_argument("--json", action="store_true", help="print the scores as JSON")
    command.add_argument("--data-dir", type=Path, default=Path(".lodestar/eval"), help="own stack's state (--model)")
    command.add_argument(
        "--backend", default="transformers", choices=BACKENDS, help="own stack's inference backend (--model)"
    )
    command.add_argument("--slots", type=int, default=2, help="sessions the own stack's node runs at once")
    command.add_argument(
        "--start-timeout-s", type=float, default=180.0, help="seconds each own service may take to serve (--model)"
    )
    client_security.add_arguments(command)
    command.set_defaults(handler=client_security.secured(_handle))
