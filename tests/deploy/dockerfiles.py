"""Reading deploy/Dockerfile.* and the settings their environment sets, for the static deploy tests
(test_images.py, test_k8s.py)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@dataclass
class Stage:
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kind, args in self.instructions if kind == keyword]


def parse(path: Path) -> tuple[list[str], list[Stage]]:
    """Global ARGs and the stages of a Dockerfile (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#")))
    global_args: list[str] = []
    stages: list[Stage] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, _, args = line.strip().partition(" ")
        kind = kind.upper()
        if kind == "FROM":
            stages.append(Stage(args.split()[0]))
        elif stages:
            stages[-1].instructions.append((kind, args.strip()))
        elif kind == "ARG":
            global_args.append(args.strip())
    return global_args, stages


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for item in shlex.split(args):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def is_setting(klass: type[BaseModel], key: str) -> bool:
    """Whether `key` (a variable's name after LODESTAR_<SERVICE>_, lower case) is a setting of `klass`: a field,
    or `<section>__<field>`, a field of one of its sections (lodestar/settings.py)."""
    name, _, inner = key.partition("__")
    field = klass.model_fields.get(name)
    if field is None or not inner:
        return field is not None
    section = field.annotation
    return isinstance(section, type) and issubclass(section, BaseModel) and inner in section.model_fields
