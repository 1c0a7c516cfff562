"""The five distributions build as wheels that each install exactly their own top-level import package
(docs/architecture.md "Packages"): no wheel claims a generic name such as `services`, and each service wheel
requires the kernel at its own version."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {
    ".": ("lodestar", {"lodestar", "lodestar_app"}),
    "services/gateway": ("lodestar_gateway", {"lodestar_gateway"}),
    "services/rollout": ("lodestar_rollout", {"lodestar_rollout"}),
    "services/inference": ("lodestar_inference", {"lodestar_inference"}),
    "services/trainer": ("lodestar_trainer", {"lodestar_trainer"}),
}
"""Project directory -> (wheel name prefix, the top-level names its files install)."""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
         *(str(REPO / project) for project in EXPECTED)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    found = {path.name.split("-")[0]: path for path in out.glob("*.whl")}
    return {project: found[prefix] for project, (prefix, _) in EXPECTED.items()}


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = {name.split("/")[0] for name in archive.namelist()}
    return {name for name in names if not name.endswith((".dist-info", ".data"))}


def _metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        info = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(info).decode())
    return {key: message.get_all(key) or [] for key in ("Requires-Dist", "License-Expression", "Version")}


@pytest.mark.parametrize("project", list(EXPECTED))
def test_each_wheel_installs_only_its_own_package(wheels: dict[str, Path], project: str) -> None:
    assert _top_level(wheels[project]) == EXPECTED[project][1]


def test_no_two_wheels_claim_one_name(wheels: dict[str, Path]) -> None:
    claimed = [name for wheel in wheels.values() for name in _top_level(wheel)]
    assert len(claimed) == len(set(claimed))
    assert "services" not in claimed


def test_service_wheels_require_the_kernel_at_their_version(wheels: dict[str, Path]) -> None:
    version = _metadata(wheels["."])["Version"][0]
    for project, wheel in wheels.items():
        metadata = _metadata(wheel)
        assert metadata["License-Expression"] == ["Apache-2.0"]
        if project != ".":
            assert metadata["Version"] == [version]
            assert f"lodestar=={version}" in metadata["Requires-Dist"]
    extras = _metadata(wheels["."])["Requires-Dist"]
    assert f'lodestar-gateway=={version}; extra == "gateway"' in extras


def test_the_kernel_wheel_carries_the_dashboard_and_the_license(wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels["."]) as archive:
        names = set(archive.namelist())
    assert "lodestar_app/dashboard/static/index.html" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    with zipfile.ZipFile(wheels["services/inference"]) as archive:
        assert "lodestar_inference/chat_templates/tiny_hermes.jinja" in archive.namelist()
