"""`lodestar train CONFIG`: one GRPO training run from a TOML file, with a live view and a summary.

Reads `[train]` (train_config.py) and the run spec it names, attaches to a running `lodestar up` stack or
starts its own (train_stack.py), attacks the run's verifier with `lodestar redteam`'s hacks on a few tasks and
refuses to train when one pays (train_redteam.py; `--no-redteam` skips it, loudly), creates the run on rollout,
starts a trainer process on it (the file's
`[trainer]` table + the run, the model and `steps`), and shows the progress (train_view.py: a rich live
view on a terminal, one plain line per step otherwise) until the trainer has done its steps, failed,
or `timeout_s` passed; Ctrl-C / SIGTERM stops early. Then it makes sure the last step is checkpointed,
cancels what is left of the run, stops what it started, plots the rewards and prints the summary: run
directory (`<run_dir>/<run id>`), final checkpoint, metrics files, reward plot and reward rise.
Exit code 0 when every step was done, or when the run's groups ran out first (every task sampled, every
group read: after a reward saturates most groups have no signal); the summary says which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import grpc.aio
from rich.console import Console
from rich.live import Live

from lodestar.errors import DeadlineExceededError, UnavailableError
from lodestar.grpc.security import current
from lodestar.sampling import check_trainable
from lodestar.v1 import rollout_pb2, trainer_pb2, trainer_pb2_grpc
from lodestar_app.cli import client_security, train_eval, train_redteam, train_stack, train_view
from lodestar_app.cli.dashboard import start_local
from lodestar_app.cli.run import _call
from lodestar_app.cli.train_config import TrainConfig, load_train_config

if TYPE_CHECKING:
    from lodestar_rollout.evaluation import HarnessScore

_DONE = (trainer_pb2.TRAINER_STATE_STOPPED, trainer_pb2.TRAINER_STATE_FAILED)
_TRAINER_UNREACHABLE_S = 60.0


async def _snapshot(
    stub: trainer_pb2_grpc.TrainerServiceAsyncStub, rollout: str, progress: train_view.Progress
) -> None:
    progress.trainer = await stub.GetStatus(trainer_pb2.GetStatusRequest(), timeout=10.0)
    request = rollout_pb2.GetRunRequest(run_id=progress.run_id)
    progress.run = (await _call(rollout, lambda s: s.GetRun(request, timeout=10.0))).run


async def _watch(
    config: TrainConfig,
    stub: trainer_pb2_grpc.TrainerServiceAsyncStub,
    rollout: str,
    progress: train_view.Progress,
    console: Console,
    stop: asyncio.Event,
) -> None:
    """Refresh the view every second until the trainer is done, `stop` is set or the timeout passes."""
    deadline = time.monotonic() + config.timeout_s
    last_seen, printed = time.monotonic(), -1
    live = Live(train_view.render(progress), console=console, refresh_per_second=2) if console.is_terminal else None
    try:
        if live is not None:
            live.start()
        while True:
            try:
                await _snapshot(stub, rollout, progress)
                last_seen = time.monotonic()
            except (grpc.aio.AioRpcError, UnavailableError, DeadlineExceededError) as error:
                if time.monotonic() - last_seen > _TRAINER_UNREACHABLE_S:
                    raise UnavailableError(f"trainer or rollout unreachable for 60 s: {error}") from error
            if live is not None:
                live.update(train_view.render(progress))
            elif progress.trainer.last_metrics.step and progress.trainer.step != printed:
                printed = progress.trainer.step
                print(train_view.plain_line(progress), flush=True)
            if progress.trainer.state in _DONE or stop.is_set():
                return
            if time.monotonic() > deadline:
                raise DeadlineExceededError(f"training did not finish within timeout_s = {config.timeout_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        if live is not None:
            live.stop()


async def _finish(stub: trainer_pb2_grpc.TrainerServiceAsyncStub, progress: train_view.Progress) -> str:
    """Checkpoint the last step unless it already is; the final checkpoint's path."""
    status = progress.trainer
    if status.state == trainer_pb2.TRAINER_STATE_FAILED or status.step == 0:
        return status.last_checkpoint_path
    if Path(status.last_checkpoint_path).name == f"step-{status.step:06d}":
        return status.last_checkpoint_path
    reply = await stub.Stop(trainer_pb2.StopRequest(save_checkpoint=True), timeout=600.0)
    return reply.checkpoint_path or status.last_checkpoint_path


def _rewards(records: list[dict[str, float]]) -> tuple[list[float], list[float], int]:
    """Reward mean and merge ratio of every step, and the groups trained on."""
    rewards = [float(record.get("reward_mean", 0.0)) for record in records]
    merges = [float(record.get("merge_ratio", 0.0)) for record in records]
    return rewards, merges, sum(int(record.get("groups", 0)) for record in records)


@dataclass(frozen=True)
class Ending:
    """Why the trainer stopped before its steps on its own without failing (`_ended_early`)."""

    state: str
    """`no signal left` (the trainer's stop_after_no_signal_groups) or `run used up` (every task sampled,
    every group read)."""
    steps_done: int
    untrained_groups: int
    """Groups read after the last step (in no step's metrics)."""
    untrained_reward: float
    """Their mean reward: what the last policies scored."""
    tasks: int = 0
    delivered: int = 0
    trained: int = 0
    stale: int = 0

    @property
    def no_signal(self) -> int:
        """Delivered groups not trained on: every sample scored alike."""
        return max(self.delivered - self.trained, 0)

    def why(self) -> str:
        """The summary's `ended` row."""
        if self.state == "no signal left":
            return (
                f"the {self.untrained_groups} groups read after step {self.steps_done} ended in a row of groups "
                "without reward signal (every sample of each scored alike: solved, or too hard; the trainer's "
                f"stop_after_no_signal_groups) and scored {self.untrained_reward:.3f} on average: nothing left "
                "to learn from this run's tasks"
            )
        after = (
            f"; the {self.untrained_groups} read after step {self.steps_done} scored {self.untrained_reward:.3f} "
            "on average (the last policies' reward, in no step's metrics)"
            if self.untrained_groups
            else ""
        )
        return (
            f"the run's {self.tasks} tasks are used up after step {self.steps_done}: of its {self.delivered} "
            f"delivered groups {self.trained} were trained on, {self.no_signal} had no reward signal (every "
            f"sample scored alike: solved, or too hard) and {self.stale} were dropped as stale{after}"
        )


def _ended_early(progress: train_view.Progress, steps_done: int, groups_trained: int) -> Ending | None:
    """The Ending when the trainer stopped before its steps on its own for a reason that is not a failure:
    the run's groups ran out (every task sampled, every group read), or the last groups it read had no reward
    signal (the trainer's `stop_after_no_signal_groups`); else None."""
    tail, run = progress.trainer, progress.run
    if tail.state != trainer_pb2.TRAINER_STATE_STOPPED:
        return None
    common = {"steps_done": steps_done, "untrained_groups": tail.untrained_groups}
    if tail.stop_reason == trainer_pb2.STOP_REASON_NO_SIGNAL:
        return Ending("no signal left", untrained_reward=tail.untrained_reward_mean, **common)
    if run.state != rollout_pb2.RUN_STATE_COMPLETED:
        return None
    return Ending(
        "run used up",
        untrained_reward=tail.untrained_reward_mean,
        tasks=len(run.spec.tasks),
        delivered=run.groups_delivered,
        trained=groups_trained,
        stale=run.groups_dropped,
        **common,
    )


async def _train(
    config: TrainConfig,
    console: Console,
    *,
    dashboard: bool = False,
    client: list[str] | None = None,
    redteam: bool = True,
) -> int:
    from lodestar_rollout.spec import load_spec_file  # the spec checks: only when running

    spec = load_spec_file(config.spec)
    check_trainable(spec.sampling)  # the trainer recomputes the run's sampling distribution: docs/trainer.md
    heldout = train_eval.heldout_spec(spec, config.eval) if config.eval is not None else None
    before: HarnessScore | None = None
    after: HarnessScore | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    started = time.monotonic()
    stack = await train_stack.open_stack(config, console, client or [])
    trainer_cluster = None
    error, checkpoint = "", ""
    board = await start_local(stack.rollout, config.run_dir, stack.model) if dashboard else None
    try:
        before = await _before_training(config, spec, heldout, stack, console, redteam=redteam)
        reply = await _call(stack.rollout, lambda s: s.CreateRun(rollout_pb2.CreateRunRequest(spec=spec), timeout=60.0))
        run_id = reply.run.run_id
        if board is not None:
            console.print(f"dashboard: {board.url}runs/{run_id}")
        config = dataclasses.replace(config, run_dir=config.run_dir / run_id)
        console.print(
            f"run {run_id} created ({len(spec.tasks)} tasks x {spec.group_size}); training {config.steps} steps"
        )
        with console.status("starting the trainer"):
            trainer_cluster, address = await train_stack.start_trainer(config, stack, run_id)
        with console.status("starting the gateway node"):
            await train_stack.start_node(config, stack)
        progress = train_view.Progress(run_id=run_id, steps=config.steps, started=started)
        async with current().aio_channel(address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            try:
                await _watch(config, stub, stack.rollout, progress, console, stop)
            except (UnavailableError, DeadlineExceededError) as failure:
                error = failure.message
            error = error or (
                progress.trainer.error if progress.trainer.state == trainer_pb2.TRAINER_STATE_FAILED else ""
            )
            try:
                with console.status("checkpointing the last step"):
                    checkpoint = await _finish(stub, progress)
            except grpc.aio.AioRpcError as failure:  # the trainer died: report what it had written
                error = error or f"trainer unreachable at the end: {failure.details()}"
                checkpoint = progress.trainer.last_checkpoint_path
        after, error = await _after_training(
            config, stack, progress, heldout, console, error=error, stopped=stop.is_set()
        )
        if before is not None or after is not None:
            train_eval.write(config.run_dir, before, after, progress.trainer.step)
    finally:
        if board is not None:
            await board.close()
        with console.status("stopping the trainer" + ("" if stack.cluster is None else " and the stack")):
            await train_stack.close(trainer_cluster, stack.cluster)
    interrupted = stop.is_set()
    code, _, _ = _report(config, console, progress, checkpoint, error, time.monotonic() - started, interrupted)
    if before is not None or after is not None:
        console.print(train_eval.table(before, after))
        if line := train_eval.verdict(before, after):
            console.print(line, highlight=False)
    return code


async def _before_training(
    config: TrainConfig,
    spec: rollout_pb2.RunSpec,
    heldout: rollout_pb2.RunSpec | None,
    stack: train_stack.Stack,
    console: Console,
    *,
    redteam: bool,
) -> HarnessScore | None:
    """Before the run is created: the red-team pass on the verifier (train_redteam.py), then the starting
    policy's held-out score when `[eval]` asks for it."""
    if redteam and config.redteam.enabled:  # attack the verifier before training on it (train_redteam.py)
        with console.status("starting the gateway node"):
            await train_stack.start_node(config, stack)
        await train_redteam.pre_pass(config.redteam, spec, stack.rollout, console)
    else:
        train_redteam.warn_skipped(console)
    if heldout is None or config.eval is None or not config.eval.before:
        return None
    with console.status("starting the gateway node"):
        await train_stack.start_node(config, stack)  # before the training run: the eval has the node
    console.print(f"evaluating the starting policy on {len(heldout.tasks)} held-out tasks")
    before = await train_eval.evaluate(stack.rollout, heldout, config.eval, console)
    console.print(train_eval.table(before, None))
    return before


async def _after_training(
    config: TrainConfig,
    stack: train_stack.Stack,
    progress: train_view.Progress,
    heldout: rollout_pb2.RunSpec | None,
    console: Console,
    *,
    error: str,
    stopped: bool,
) -> tuple[HarnessScore | None, str]:
    """After the last step: the run's final counts, the run cancelled, and (when neither failed nor stopped)
    the final policy's held-out score; (that score, the error so far or the evaluation's)."""
    run_id = progress.run_id
    with contextlib.suppress(grpc.aio.AioRpcError, UnavailableError, DeadlineExceededError):
        request = rollout_pb2.GetRunRequest(run_id=run_id)
        progress.run = (await _call(stack.rollout, lambda s: s.GetRun(request, timeout=10.0))).run
    cancel = rollout_pb2.CancelRunRequest(run_id=run_id)
    await _call(stack.rollout, lambda s: s.CancelRun(cancel, timeout=30.0))
    if heldout is None or config.eval is None or error or stopped:
        return None, error
    version = progress.trainer.policy_version
    with console.status(f"waiting for inference to serve the final policy (v{version})"):
        await train_eval.wait_for_version(stack.inference, version, etcd=stack.discovery_etcd)
    console.print(f"evaluating the final policy (v{version}) on {len(heldout.tasks)} held-out tasks")
    try:
        return await train_eval.evaluate(stack.rollout, heldout, config.eval, console), error
    except DeadlineExceededError as failure:
        return None, f"the final evaluation did not finish: {failure.message}"


def _report(
    config: TrainConfig,
    console: Console,
    progress: train_view.Progress,
    checkpoint: str,
    error: str,
    seconds: float,
    interrupted: bool,
) -> tuple[int, train_view.Outcome, Ending | None]:
    """Print the summary; the exit code (0 when every step was done, or when the run ended early without a
    failure: `Ending`), and what the summary showed, typed."""
    from lodestar_trainer.plot import plot_run  # matplotlib: only at the end

    records = train_view.run_records(config.run_dir)
    rewards, merges, groups = _rewards(records)
    plots = plot_run(config.run_dir) if rewards else []
    metrics = [p for p in (config.run_dir / "metrics.jsonl", config.run_dir / "tensorboard") if p.exists()]
    done = len(rewards) >= config.steps and not error
    ending = None if done or error or interrupted else _ended_early(progress, len(rewards), groups)
    state = "done" if done else ending.state if ending else ("failed" if error else "stopped early")
    outcome = train_view.Outcome(
        run_id=progress.run_id,
        state=state,
        steps=len(rewards),
        run_dir=config.run_dir,
        checkpoint=checkpoint,
        metrics=metrics,
        plots=[p for p in plots if p.name == "reward.png"] + [p for p in plots if p.name != "reward.png"],
        rewards=rewards,
        merge_ratio=sum(merges) / len(merges) if merges else 0.0,
        seconds=seconds,
        error=error,
        warning=progress.trainer.warning,
        note=ending.why() if ending else "",
        gaps=train_view.gaps(records),
        costs=train_view.costs(records),
    )
    console.print(train_view.summary(outcome), highlight=False)
    return (0 if done or ending else 1), outcome, ending


def _handle(args: argparse.Namespace) -> int:
    config = load_train_config(args.config)
    overrides: dict[str, object] = {}
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.attach is not None:
        overrides["attach"] = args.attach
    if args.run_dir is not None:
        overrides["run_dir"] = args.run_dir.resolve()
    config = dataclasses.replace(config, **overrides)  # type: ignore[arg-type]
    return asyncio.run(
        _train(
            config, Console(), dashboard=args.dashboard, client=client_security.given(args), redteam=not args.no_redteam
        )
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `train` command."""
    command = subparsers.add_parser("train", help="train on a run from a TOML config (live view, then a summary)")
    command.add_argument("config", type=Path, help="TOML file with [train] and [trainer] tables (docs/quickstart.md)")
    command.add_argument("--steps", type=int, default=None, help="override [train] steps")
    command.add_argument(
        "--attach", default=None, metavar="auto|never|FILE", help="override [train] attach (lodestar up's addresses)"
    )
    command.add_argument("--run-dir", type=Path, default=None, help="override [train] run_dir")
    command.add_argument(
        "--dashboard",
        action="store_true",
        help="serve the run dashboard on loopback while training (docs/dashboard.md)",
    )
    command.add_argument(
        "--no-redteam",
        action="store_true",
        help="skip the red-team pass before the first step (a warning says so; docs/redteam.md)",
    )
    client_security.add_arguments(command)  # for --attach: a secured stack (train_stack.py)
    command.set_defaults(handler=client_security.secured(_handle))
