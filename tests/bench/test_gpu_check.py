"""bench/gpu_check.py's reduced mode (`--device cpu`): every section runs on tiny shapes and writes its table, so
the script that will run once on a GPU cannot rot. The GPU figures themselves come from the GPU run
(docs/gpu.md); here only the checks that have a verdict on CPU must pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_runs_every_section_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    table = out.read_text()
    assert table == done.stdout.strip() + "\n", "stdout and --out carry the same table"
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    results = {(row[0].lstrip("| "), row[1]): row[2] for row in rows}
    assert {section for section, _ in results} == {"1", "2", "3", "4", "5"}
    assert not [key for key, result in results.items() if result in ("FAIL", "error")]
    assert [row[0].lstrip("| ") for row in rows] == sorted((row[0].lstrip("| ") for row in rows), key="14235".index), (
        "sections in the order 1, 4, 2, 3, 5 (the 4B rows first on a GPU)"
    )
    assert results["2", "activation checkpointing = none, fp32, explicit"] == "pass"
    assert results["2", "builders equal, fp32, explicit"] == "pass"
    assert results["2", "builders equal, fp32, flex"] == "skipped"  # no flex backward on CPU
    assert results["3", "flex vs dense, float32, random tree of 300"] == "pass"
    assert results["3", "explicit vs dense, bfloat16, packed documents of 300"] == "pass"
    assert results["5", "engine logprobs = teacher forcing, fp32"] == "pass"
    throughput = [key for key in results if key[0] == "4"]
    assert len(throughput) == 3, "one row per builder"
    assert all(results[key] == "measured" for key in throughput)
    details = {(row[0].lstrip("| "), row[1]): row[3] for row in rows}
    assert all("loss, gradients and weights finite" in details[key] for key in throughput)


def test_missing_packages_are_named_before_anything_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU machine a missing small package (protobuf >= 7.35.1 above all) must stop the check at once
    with its name, not as an ImportError deep in lodestar."""
    sys.path.insert(0, str(SCRIPT.parent.parent))
    import bench.gpu_check as gpu_check

    assert gpu_check.missing_packages() == []
    monkeypatch.setitem(gpu_check.NEEDS, "protobuf", (99, 0))
    monkeypatch.setitem(gpu_check.NEEDS, "no-such-package-lodestar", (0,))
    assert gpu_check.missing_packages() == ["protobuf>=99.0", "no-such-package-lodestar"]
