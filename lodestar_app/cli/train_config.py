"""The `[train]` and `[eval]` tables of a `lodestar train CONFIG` file: what to run, where, how long, and
what to evaluate the policy on before and after.

The same TOML file's `[trainer]` table is the trainer service's own settings (docs/trainer.md); the
trainer process `lodestar train` starts reads it with `--config`. Relative paths in `[train]` (`spec`,
`model`) and `[eval]` (`tasks`) are relative to the config file; `run_dir` and `data_dir` are relative to
the working directory.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from lodestar.errors import InvalidArgumentError

UP_ADDRESSES = Path(".lodestar/up/addresses.json")
"""Where `lodestar up` records its addresses (the default of `attach = "auto"`)."""


@dataclass(frozen=True)
class EvalConfig:
    """The `[eval]` table: held-out tasks scored on the starting policy and on the final one."""

    tasks: Path
    samples: int = 4
    before: bool = True
    pass_threshold: float = 1.0
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class RedTeamConfig:
    """The `[redteam]` table: the red-team pass `lodestar train` runs before its first step (train_redteam.py)."""

    enabled: bool = True
    tasks: int = 2
    timeout_s: float = 300.0
    hacks: tuple[str, ...] = ()
    """Only these hack kinds (empty: every kind that applies to the spec's verifier)."""
    pass_threshold: float = 1.0


@dataclass(frozen=True)
class TrainConfig:
    config_path: Path
    spec: Path
    steps: int
    run_dir: Path
    data_dir: Path = Path(".lodestar/train")
    model: Path | None = None
    attach: str = "auto"
    slots: int = 8
    ready_buffer: int = 4
    backend: str = "transformers"
    inference_replicas: int = 1
    max_new_tokens: int | None = None
    """The inference service's cap on new tokens per call in the stack it starts (None: the service's own)."""
    vllm_lora: str | None = None
    """How the vllm backend of the stack it starts serves LoRA pushes (None: the service's own, `merge`)."""
    timeout_s: float = 1800.0
    start_timeout_s: float = 180.0
    eval: EvalConfig | None = None
    """The `[eval]` table, when the file has one."""
    redteam: RedTeamConfig = RedTeamConfig()
    """The `[redteam]` table (its defaults when the file has none)."""


KEYS: dict[str, str] = {
    "spec": "Run spec file (YAML/JSON, docs/runs.md), relative to the config file.",
    "steps": "Optimizer steps to train (`--steps` overrides).",
    "run_dir": "Parent of the run directory `<run_dir>/<run id>` (relative to the working directory; "
    "`--run-dir` overrides).",
    "data_dir": "State and logs of the stack `lodestar train` starts itself (etcd data, service logs, the "
    "rollout store `rollout.sqlite`, the tiny model).",
    "model": "Model directory to serve and train (relative to the config file); default: the offline tiny "
    "model, built into `<data_dir>/tiny-model`. When attached, the model `lodestar up` serves.",
    "attach": "`auto`: use the `lodestar up` stack recorded in `.lodestar/up/addresses.json` when it answers, "
    "else start one; `never`: always start one; a path: the addresses file of a stack that must be up "
    "(`--attach` overrides).",
    "slots": "Sessions the gateway node of the stack it starts runs at once.",
    "ready_buffer": "Prepared sessions waiting for a slot on that node.",
    "backend": "Inference backend of the stack it starts (`transformers`, `vllm`, `scripted`).",
    "inference_replicas": "Inference replicas of the stack it starts: the gateway sends every call of a session to "
    "one of them (session affinity, failover) and the trainer pushes each policy version to all. With more than "
    "one they register in the stack's etcd and the gateway and trainer follow them there: a replica that dies "
    "costs no training step (its sessions continue on the others or are retried as infrastructure failures).",
    "max_new_tokens": "Cap on new tokens per model call of the stack it starts (the inference service's "
    "`max_new_tokens`; unset: its default). For harnesses that ask for no limit (Pi) on tasks with short "
    "answers: a call that reaches it ends with finish reason `length`, as a harness's own limit would.",
    "vllm_lora": 'With `backend = "vllm"` and `[trainer.lora]`: how the stack it starts serves each pushed '
    "adapter (the inference service's `vllm_lora`): `merge` (unset: the default) merges it onto the base and "
    "reloads, `native` hot-loads it into vLLM's own LoRA serving (docs/trainer.md, LoRA).",
    "timeout_s": "The training (from the trainer's start to its last step) must end within this many seconds; "
    "then it stops and reports.",
    "start_timeout_s": "Each service it starts must answer SERVING within this many seconds.",
}
"""Every key of the `[train]` table and what it means (docs/configuration.md is generated from it)."""
_KEYS = set(KEYS)

EVAL_KEYS: dict[str, str] = {
    "tasks": "Held-out tasks (relative to the config file): a tasks JSONL file, run with the training spec's "
    "harness, verifier and sampling policy; or a run spec file of its own. Keep them disjoint from the training "
    "tasks.",
    "samples": "Samples per task (pass@1 is averaged over them; more samples, a narrower interval).",
    "before": "Also score the starting policy, before the first step (false: only the final policy).",
    "pass_threshold": "A sample passes when its reward is at least this.",
    "timeout_s": "Each evaluation (before, after) must end within this many seconds.",
}
"""Every key of the `[eval]` table: with one, `lodestar train` scores the policy it starts from and the one it
ends with on these tasks (pass@1 with its 95% interval, mean reward), prints both and plots them next to the
training reward; see lodestar_app/cli/train_eval.py."""


REDTEAM_KEYS: dict[str, str] = {
    "enabled": "Run the red-team pass before the first step (false, or `lodestar train --no-redteam`: skip it, "
    "with a warning).",
    "tasks": "Tasks of the run spec attacked (spread over the task set); each hack kind that applies to the "
    "verifier runs once on each.",
    "timeout_s": "The whole pass must end within this many seconds.",
    "hacks": "Only these hack kinds (names as in docs/redteam.md); empty: every kind that applies to the verifier.",
    "pass_threshold": "The honest-failure agent (`noop`) pays, i.e. the verifier rewards doing nothing, at a reward "
    "of at least this.",
}
"""Every key of the `[redteam]` table: before its first step `lodestar train` attacks the run's verifier with
`lodestar redteam`'s hacks on a few tasks, through the stack's own node and runtime, and refuses to train when
one pays (docs/redteam.md)."""


def load_train_config(path: Path) -> TrainConfig:
    """Read and check the `[train]` table of `path` (InvalidArgumentError naming the problem)."""
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise InvalidArgumentError(f"cannot read {path}: {error}") from error
    table = document.get("train")
    if not isinstance(table, dict):
        raise InvalidArgumentError(f"{path} has no [train] table")
    unknown = set(table) - _KEYS
    if unknown:
        raise InvalidArgumentError(f"{path}: unknown [train] keys: {', '.join(sorted(unknown))}")
    if "spec" not in table or "steps" not in table:
        raise InvalidArgumentError(f"{path}: [train] needs `spec` (the run spec) and `steps`")
    base = path.resolve().parent
    steps = int(table["steps"])
    if steps <= 0:
        raise InvalidArgumentError(f"{path}: [train] steps must be positive")
    model = table.get("model")
    return TrainConfig(
        config_path=path.resolve(),
        spec=base / str(table["spec"]),
        steps=steps,
        run_dir=Path(str(table.get("run_dir", "runs/train"))).resolve(),
        data_dir=Path(str(table.get("data_dir", ".lodestar/train"))).resolve(),
        model=base / str(model) if model else None,
        attach=str(table.get("attach", "auto")),
        slots=int(table.get("slots", 8)),
        ready_buffer=int(table.get("ready_buffer", 4)),
        backend=str(table.get("backend", "transformers")),
        inference_replicas=_positive(path, "inference_replicas", table.get("inference_replicas", 1)),
        max_new_tokens=_optional_positive(path, "max_new_tokens", table.get("max_new_tokens")),
        vllm_lora=_vllm_lora(path, table),
        timeout_s=float(table.get("timeout_s", 1800.0)),
        start_timeout_s=float(table.get("start_timeout_s", 180.0)),
        eval=_eval_config(path, base, document.get("eval")),
        redteam=_redteam_config(path, document.get("redteam", {})),
    )


def _vllm_lora(path: Path, table: dict[str, object]) -> str | None:
    value = table.get("vllm_lora")
    if value is None:
        return None
    if value not in ("merge", "native"):
        raise InvalidArgumentError(f'{path}: [train] vllm_lora must be "merge" or "native", not {value!r}')
    if table.get("backend") != "vllm":
        raise InvalidArgumentError(f'{path}: [train] vllm_lora needs backend = "vllm"')
    return str(value)


def _eval_config(path: Path, base: Path, table: object) -> EvalConfig | None:
    if table is None:
        return None
    if not isinstance(table, dict) or "tasks" not in table:
        raise InvalidArgumentError(f"{path}: [eval] needs `tasks` (a tasks JSONL or a run spec file)")
    unknown = set(table) - set(EVAL_KEYS)
    if unknown:
        raise InvalidArgumentError(f"{path}: unknown [eval] keys: {', '.join(sorted(unknown))}")
    before = table.get("before", True)
    if not isinstance(before, bool):
        raise InvalidArgumentError(f"{path}: [eval] before must be true or false")
    timeout_s = float(table.get("timeout_s", 1800.0))
    threshold = float(table.get("pass_threshold", 1.0))
    if timeout_s <= 0:
        raise InvalidArgumentError(f"{path}: [eval] timeout_s must be positive")
    return EvalConfig(
        tasks=base / str(table["tasks"]),
        samples=_positive(path, "samples", table.get("samples", 4), table="eval"),
        before=before,
        pass_threshold=threshold,
        timeout_s=timeout_s,
    )


def _redteam_config(path: Path, table: object) -> RedTeamConfig:
    if not isinstance(table, dict):
        raise InvalidArgumentError(f"{path}: [redteam] must be a table")
    unknown = set(table) - set(REDTEAM_KEYS)
    if unknown:
        raise InvalidArgumentError(f"{path}: unknown [redteam] keys: {', '.join(sorted(unknown))}")
    enabled = table.get("enabled", True)
    hacks = table.get("hacks", [])
    if not isinstance(enabled, bool):
        raise InvalidArgumentError(f"{path}: [redteam] enabled must be true or false")
    if not isinstance(hacks, list) or not all(isinstance(name, str) for name in hacks):
        raise InvalidArgumentError(f"{path}: [redteam] hacks must be a list of hack names")
    timeout_s = float(table.get("timeout_s", 300.0))
    if timeout_s <= 0:
        raise InvalidArgumentError(f"{path}: [redteam] timeout_s must be positive")
    return RedTeamConfig(
        enabled=enabled,
        tasks=_positive(path, "tasks", table.get("tasks", 2), table="redteam"),
        timeout_s=timeout_s,
        hacks=tuple(hacks),
        pass_threshold=float(table.get("pass_threshold", 1.0)),
    )


def _optional_positive(path: Path, key: str, value: object) -> int | None:
    return None if value is None else _positive(path, key, value)


def _positive(path: Path, key: str, value: object, *, table: str = "train") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{path}: [{table}] {key} must be a positive integer, got {value!r}")
    return value
