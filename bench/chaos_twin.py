"""The unbroken twin: the chaos trainer's weights against those of a run without faults on the same groups
(bench/chaos.py; docs/chaos.md "The unbroken twin").

After the stack stopped, a trainer that nothing interrupts trains from the same tiny model, with the same settings,
on the same groups in the same order, up to the step of the chaos trainer's last checkpoint: a rollout instance on a
copy of the run's store (with an etcd member of its own) serves the run's group stream again from its first
delivery (StreamGroups resumes by delivery number, and every group the chaos trainer read had been delivered), and
the twin pushes its weights nowhere (`--inference ''`). The check compares the two checkpoints' weights and AdamW
state tensor by tensor, bit for bit (what a resume promises: tests/trainer/test_checkpoint.py), and the metrics of
every step of the final lineage that do not depend on time or on the versions pushed.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from safetensors.torch import load_file

from bench.chaos_checks import Check, lineage
from bench.chaos_stack import SERVING, ChaosStack, Proc, etcd_argv, etcd_healthy, healthy, serve_argv, wait_until
from lodestar_app.local import child_env, free_port

NAME = "weights equal an unbroken run's"
TWIN_TIMEOUT_S = 1800.0
"""The twin's start and every step up to the chaos trainer's last checkpoint (the hour's ~150 steps take minutes:
no step waits for sessions)."""
STEP_FIELDS = ("groups", "samples", "tokens_trained", "reward_mean", "loss", "grad_norm", "clip_fraction", "kl")
"""The metrics of a step that the groups, the weights and the settings alone decide (not its time, not the policy
version: a resumed trainer pushes past the versions its replicas served, so the chaos run's versions run ahead of
its steps; not the counters a restart sets back to 0)."""


def unbroken_twin(stack: ChaosStack, timeout: float = TWIN_TIMEOUT_S) -> Check:
    """Train the twin (module docstring) under `stack.work`/twin and compare; the check."""
    last = stack.latest_checkpoint()
    if last is None:
        return Check(NAME, True, "no checkpoint was written: nothing to compare", judged=False)
    twin = stack.work / "twin"
    step = int(last.name.removeprefix("step-"))
    try:
        mine = _train_twin(stack, twin, step, timeout)
    except RuntimeError as error:
        return Check(NAME, False, f"the twin did not reach step {step}: {error}")
    return compare(last, mine, lineage(stack.run_dir / "metrics.jsonl"), lineage(twin / "runs" / "metrics.jsonl"))


def _train_twin(stack: ChaosStack, twin: Path, step: int, timeout: float) -> Path:
    """Run the twin's etcd, rollout and trainer until its checkpoint of `step` is written; its directory."""
    (twin / "logs").mkdir(parents=True, exist_ok=True)
    store = twin / "rollout.sqlite"
    for suffix in ("", "-wal", "-shm"):  # the stopped store as SQLite left it
        if (found := Path(f"{stack.store}{suffix}")).exists():
            shutil.copy2(found, f"{store}{suffix}")
    url, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    procs: list[Proc] = []

    def start(name: str, kind: str, argv: list[str], port: int = 0) -> Proc:
        proc = Proc(name, kind, argv, twin / "logs" / f"{name}.log", child_env(kind), port)
        proc.start()
        procs.append(proc)
        return proc

    deadline = time.monotonic() + timeout
    try:
        etcd = start("etcd", "etcd", etcd_argv("twin", twin / "etcd", url, peer, f"twin={peer}"))
        wait_until("the twin's etcd", lambda: etcd_healthy(url), deadline - time.monotonic(), etcd)
        port = free_port()
        rollout = start("rollout", "rollout", serve_argv("rollout", port, ["--etcd", url, "--store", str(store)]), port)
        wait_until("the twin's rollout", lambda: healthy(port) == SERVING, deadline - time.monotonic(), rollout)
        args = ["--config", str(stack.trainer_config()), "--run", stack.run_id, "--model", str(stack.model)]
        args += ["--run-dir", str(twin / "runs"), "--steps", str(step), "--rollout", f"127.0.0.1:{port}"]
        trainer = start("trainer", "trainer", serve_argv("trainer", free_port(), [*args, "--inference", ""]))
        written = twin / "runs" / "checkpoints" / f"step-{step:06d}"
        wait_until(f"the twin's step {step}", written.is_dir, deadline - time.monotonic(), trainer)
        return written
    finally:
        for proc in reversed(procs):
            proc.terminate()


def compare(chaos: Path, twin: Path, chaos_steps: list[dict[str, Any]], twin_steps: list[dict[str, Any]]) -> Check:
    """The check from two checkpoint directories and the two runs' final lineages (chaos_checks.lineage)."""
    step = int(chaos.name.removeprefix("step-"))
    weights = _differing(load_file(str(chaos / "model.safetensors")), load_file(str(twin / "model.safetensors")))
    moments = _differing(_optimizer_tensors(chaos), _optimizer_tensors(twin))
    ours, theirs = chaos_steps[:step], twin_steps[:step]
    steps_differ = [
        int(a["step"]) for a, b in zip(ours, theirs, strict=False) if any(a[k] != b[k] for k in STEP_FIELDS)
    ]
    counted = [len(ours), len(theirs)] == [step, step]
    ok = not weights and not moments and not steps_differ and counted
    found = f"step {step}: {_tensors(weights, 'weights')}, {_tensors(moments, 'AdamW state')}; "
    found += f"{len(theirs)} of {step} steps' metrics compared, " + (
        f"differing at steps {steps_differ[:5]}" if steps_differ else "all equal"
    )
    return Check(NAME, ok, found)


def _optimizer_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    return {f"{index}.{key}": value for index, moments in state.items() for key, value in moments.items()}


def _differing(ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor]) -> list[str]:
    """The names whose tensors are not equal bit for bit (or are in one only)."""
    names = sorted(set(ours) | set(theirs))
    return [n for n in names if n not in ours or n not in theirs or not torch.equal(ours[n], theirs[n])]


def _tensors(differing: list[str], what: str) -> str:
    return f"{what} equal bit for bit" if not differing else f"{what} differ in {len(differing)}: {differing[:3]}"


def main(argv: list[str] | None = None) -> int:
    """`python bench/chaos_twin.py WORK`: the twin of a finished chaos run's work directory (its check as JSON)."""
    stack = ChaosStack(Path((argv or sys.argv[1:])[0]))
    last = stack.latest_checkpoint()
    if last is None:
        raise SystemExit(f"no checkpoint under {stack.checkpoints}")
    stack.run_id = json.loads((last / "trainer_state.json").read_text())["run_id"]
    check = unbroken_twin(stack)
    print(json.dumps({"check": check.name, "ok": check.ok, "found": check.found}))
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
