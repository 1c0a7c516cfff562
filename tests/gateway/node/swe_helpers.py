"""Helpers shared by the `swe` verifier tests: the swe-mini tasks (examples/swe-mini), a host session runtime
with a task's repository prepared, and the `swe` verifier's score of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format

from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.harnesses import Launcher
from lodestar_gateway.node.harnesses.sandbox import Sandbox
from lodestar_gateway.node.repository import prepare_repository
from lodestar_gateway.node.runtimes import HostBackend, HostRuntime
from lodestar_gateway.node.verifiers import VerifierInput, make_verifier

SWE_MINI = Path(__file__).resolve().parents[3] / "examples" / "swe-mini"


def swe_mini_tasks() -> dict[str, rollout_pb2.Task]:
    """The swe-mini tasks by task id, each repository source made an absolute path."""
    tasks = {}
    for line in (SWE_MINI / "tasks.jsonl").read_text().splitlines():
        task = json_format.Parse(line, rollout_pb2.Task())
        task.repository.source = str(SWE_MINI / task.repository.source)
        tasks[task.task_id] = task
    return tasks


async def swe_session(
    tmp_path: Path, task: rollout_pb2.Task, name: str = "s1-a1", *, sandboxed: bool = False
) -> HostRuntime:
    """A host session runtime under `tmp_path/sessions` with `task`'s files and its repository prepared
    (`sandboxed`: in the node's bubblewrap sandbox, as a gateway node runs it)."""
    sessions = tmp_path / "sessions"
    launcher = Launcher(sandbox=Sandbox(hidden=[sessions])) if sandboxed else Launcher()
    runtime = await HostBackend(sessions, launcher).create(name, dict(task.files))
    await prepare_repository(task.repository, runtime.real.workdir)
    return runtime


def runtime_input(runtime: HostRuntime, task: rollout_pb2.Task, *, pristine: bool = True) -> VerifierInput:
    """A verifier's input for a session of `runtime` that ended with the answer "done"; `pristine` False: the
    workspace on the node is unknown (the swe verifier then scores in place, as for an in-image repository)."""
    return VerifierInput(
        task=task,
        final_answer="done",
        workspace=runtime.visible.workdir,
        timed_out=False,
        run=runtime.run_process,
        scratch=runtime.real.tmpdir,
        scratch_visible=runtime.visible.tmpdir,
        root=runtime.root,
        workspace_host=runtime.real.workdir if pristine else None,
        owner=runtime.owner,
    )


async def swe_score(
    runtime: HostRuntime, task: rollout_pb2.Task, *, pristine: bool = True, **config: Any
) -> tuple[float, dict[str, Any]]:
    """The swe verifier's reward and details; `pristine` False: as for an in-image repository (in place)."""
    spec = rollout_pb2.VerifierSpec(kind="swe")
    spec.config.update(config)
    verdict = await make_verifier(spec).score(runtime_input(runtime, task, pristine=pristine))
    return verdict.reward, verdict.details
