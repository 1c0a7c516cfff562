"""scripts/images.sh stages the GPU images' build contexts (`SERVICES="inference-cuda trainer"`, --stage-only),
run for real, offline: lodestar's own wheels are built, and the GPU wheelhouse is a directory of stand-in
wheels (metadata only) for vLLM 0.32, the CUDA torch and every other requirement of `lodestar[inference,vllm]`
and `lodestar[trainer]`, each at a version the real requirements admit. The real wheels are several GB
(docs/deploy.md, "A GPU deployment"); what this checks is the script's logic: without them it stops and names
what is missing and how to fetch it; with them each context gets exactly its extra's closure for the GPU
target (Python 3.11, manylinux x86_64); a CPU build of torch in the wheelhouse is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GPU_TAG = "cp311-cp311-manylinux_2_28_x86_64"
VLLM_REQUIRES = ["torch==2.13.0", "transformers<5.20.0,>=5.16.1"]
"""vllm 0.32.0's own pins on torch and transformers (its wheel's METADATA)."""


def write_wheel(directory: Path, name: str, version: str, requires: list[str], tag: str = "py3-none-any") -> Path:
    """A wheel holding nothing but its metadata: enough for pip to resolve and download it."""
    dist = canonicalize_name(name).replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    path = directory / f"{dist}-{version}-{tag}.whl"
    metadata = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"] + [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{info}/METADATA", "\n".join(metadata) + "\n")
        archive.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


def requires_of(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        info = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(info).decode().splitlines()
    found = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    active = extras | {""}
    return [r for r in found if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in active)]


def admitted_version(specifiers: SpecifierSet) -> str:
    """A version every specifier admits, taken from the specifiers' own bounds."""
    candidates = [spec.version.replace(".*", ".0") for spec in specifiers] + ["1.0"]
    return next(v for v in candidates if specifiers.contains(v, prereleases=True))


def stand_in_wheelhouse(directory: Path, own: Path) -> None:
    """Wheels for the closure of lodestar[inference,vllm,trainer]: vllm and a CUDA-tagged torch with their
    real pins, everything else (no dependencies of its own) at a version every requirer admits."""
    ours = {canonicalize_name(p.name.split("-")[0]): p for p in own.glob("*.whl")}
    requirements = requires_of(ours["lodestar"], {"inference", "vllm", "trainer"})
    for name in ("lodestar-inference", "lodestar-trainer"):
        requirements += requires_of(ours[name], {"vllm"})
    requirements += [Requirement(r) for r in VLLM_REQUIRES]
    specifiers: dict[str, SpecifierSet] = defaultdict(SpecifierSet)
    for requirement in requirements:
        specifiers[canonicalize_name(requirement.name)] &= requirement.specifier
    for name, spec in specifiers.items():
        if name in ours:
            continue
        if name == "vllm":
            write_wheel(directory, "vllm", "0.32.0", VLLM_REQUIRES, "cp38-abi3-manylinux_2_28_x86_64")
        elif name == "torch":
            write_wheel(directory, "torch", admitted_version(spec), [], GPU_TAG)
        else:
            write_wheel(directory, name, admitted_version(spec), [])


def stage(stage_dir: Path, wheels: Path, services: str = "inference-cuda trainer") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STAGE": str(stage_dir), "GPU_WHEELS": str(wheels), "SERVICES": services,
           "PYTHON": sys.executable}  # fmt: skip
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "images.sh"), "--stage-only"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def staged(context: Path) -> dict[str, str]:
    """Distribution name -> wheel file name of a staged context."""
    return {canonicalize_name(p.name.split("-")[0]): p.name for p in (context / "wheels").glob("*.whl")}


def test_the_gpu_contexts_are_staged_from_the_gpu_wheelhouse_or_refused(tmp_path: Path) -> None:
    stage_dir, wheels = tmp_path / "images", tmp_path / "wheels-cuda"

    missing = stage(stage_dir, wheels)  # an empty GPU wheelhouse: a refusal that says what and how
    assert missing.returncode == 1, missing.stderr
    assert "--download" in missing.stderr, missing.stderr
    assert "lodestar[inference,vllm]" in missing.stderr, missing.stderr
    assert not list((stage_dir / "inference-cuda" / "wheels").glob("*.whl"))
    own = stage_dir / "own"
    assert {p.name.split("-")[0] for p in own.glob("*.whl")} == {
        "lodestar", "lodestar_gateway", "lodestar_rollout", "lodestar_inference", "lodestar_trainer"
    }  # fmt: skip

    stand_in_wheelhouse(wheels, own)
    done = stage(stage_dir, wheels)
    assert done.returncode == 0, done.stderr
    inference, trainer = staged(stage_dir / "inference-cuda"), staged(stage_dir / "trainer")
    assert inference["vllm"] == "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert inference["torch"] == trainer["torch"] == f"torch-2.13.0-{GPU_TAG}.whl"
    assert {"lodestar", "lodestar-inference", "transformers"} <= set(inference)
    assert {"lodestar-trainer", "tensorboard", "matplotlib"} <= set(trainer)
    assert not {"lodestar-gateway", "lodestar-rollout", "lodestar-trainer", "tensorboard"} & set(inference)
    assert not {"vllm", "lodestar-inference", "lodestar-gateway"} & set(trainer)

    (wheels / f"torch-2.13.0-{GPU_TAG}.whl").unlink()  # only a CPU build of torch: refused
    write_wheel(wheels, "torch", "2.13.0+cpu", [], GPU_TAG)
    cpu = stage(stage_dir, wheels, "inference-cuda")
    assert cpu.returncode == 1
    assert "CPU build of torch" in cpu.stderr, cpu.stderr
