"""docs/configuration.md names every configuration key the code reads: each `[train]` key, each field of every
service's settings class (the shared ones in "Every service", the others under their own section) and each field
of the run spec's messages. Regenerate it with `.venv/bin/python scripts/config_reference.py`."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from lodestar.settings import EtcdClientSettings, ServiceSettings
from lodestar_app.cli.train_config import EVAL_KEYS, KEYS, REDTEAM_KEYS, EvalConfig, RedTeamConfig, TrainConfig

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "configuration.md"
HINT = "docs/configuration.md is stale: run .venv/bin/python scripts/config_reference.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys_by_section() -> dict[str, set[str]]:
    """Heading (`## ...` or `### ...`) -> the keys in the first column of its table."""
    sections: dict[str, set[str]] = {}
    current = ""
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("#"):
            current = line.lstrip("#").strip()
            sections.setdefault(current, set())
        elif match := re.match(r"^\| `([\w.]+)` \|", line):
            sections[current].add(match.group(1))
    return sections


def test_train_keys_are_the_config_fields_and_all_listed() -> None:
    fields = {field.name for field in dataclasses.fields(TrainConfig)} - {"config_path", "eval", "redteam"}
    assert set(KEYS) == fields
    missing = fields - _keys_by_section()["`[train]`: `lodestar train`"]
    assert not missing, f"{HINT} (missing: {sorted(missing)})"


def test_eval_keys_are_the_eval_config_fields_and_all_listed() -> None:
    fields = {field.name for field in dataclasses.fields(EvalConfig)}
    assert set(EVAL_KEYS) == fields
    missing = fields - _keys_by_section()["`[eval]`: held-out evaluation around `lodestar train`"]
    assert not missing, f"{HINT} (missing: {sorted(missing)})"


def test_redteam_keys_are_the_redteam_config_fields_and_all_listed() -> None:
    fields = {field.name for field in dataclasses.fields(RedTeamConfig)}
    assert set(REDTEAM_KEYS) == fields
    missing = fields - _keys_by_section()["`[redteam]`: the red-team pass before `lodestar train`'s first step"]
    assert not missing, f"{HINT} (missing: {sorted(missing)})"


@pytest.mark.parametrize("section", ["inference", "gateway", "rollout", "trainer"])
def test_every_service_setting_is_listed(section: str) -> None:
    generator = _generator()
    model = next(model for model in generator.SERVICES if model.section == section)
    sections = _keys_by_section()
    listed = sections[f"`[{section}]`"] | sections["Every service"]
    missing = set(model.model_fields) - listed
    assert not missing, f"{HINT} (missing: {sorted(missing)})"
    assert sections["Every service"] >= set(ServiceSettings.model_fields) | set(EtcdClientSettings.model_fields)


def test_every_run_spec_field_is_listed() -> None:
    generator = _generator()
    messages = generator._proto_messages()
    sections = _keys_by_section()
    for name in ("RunSpec", "Task", "RepositoryTask", "HarnessSpec", "VerifierSpec", "RuntimeSpec", "SamplingPolicy"):
        expected = {generator._camel(field) for field in messages[name]}
        assert sections[f"`{name}`"] == expected, HINT
