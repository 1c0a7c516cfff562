"""The `[train]` table of a `lodestar train CONFIG` file: what to run, where, and how long.

The same TOML file's `[trainer]` table is the trainer service's own settings (docs/trainer.md); the
trainer process `lodestar train` starts reads it with `--config`. Relative paths in `[train]` (`spec`,
`model`) are relative to the config file; `run_dir` and `data_dir` are relative to the working directory.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from lodestar.errors import InvalidArgumentError

UP_ADDRESSES = Path(".lodestar/up/addresses.json")
"""Where `lodestar up` records its addresses (the default of `attach = "auto"`)."""


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
    timeout_s: float = 1800.0
    start_timeout_s: float = 180.0


_KEYS = {
    "spec",
    "steps",
    "run_dir",
    "data_dir",
    "model",
    "attach",
    "slots",
    "ready_buffer",
    "backend",
    "timeout_s",
    "start_timeout_s",
}


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
        timeout_s=float(table.get("timeout_s", 1800.0)),
        start_timeout_s=float(table.get("start_timeout_s", 180.0)),
    )
