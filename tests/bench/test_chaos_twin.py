"""bench/chaos_twin.py's comparison, on written checkpoints: equal only when every weight and AdamW moment is equal
bit for bit and every step's group-decided metrics agree, over all the steps up to the checkpoint. (The twin
itself trains in the short chaos run, tests/e2e/test_chaos.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bench.chaos_twin import STEP_FIELDS, compare


def _checkpoint(root: Path, weight: torch.Tensor, moment: torch.Tensor, step: int = 2) -> Path:
    path = root / "checkpoints" / f"step-{step:06d}"
    path.mkdir(parents=True)
    save_file({"lm_head.weight": weight, "embed.weight": torch.ones(2, 2)}, str(path / "model.safetensors"))
    state = {0: {"step": torch.tensor(2.0), "exp_avg": moment, "exp_avg_sq": moment.square()}}
    torch.save({"state": state, "param_groups": [{"lr": 0.1, "params": [0]}]}, path / "optimizer.pt")
    return path


def _steps(count: int, **changed: float) -> list[dict[str, Any]]:
    records = [
        {"step": s, "time": 1000.0 + s, "policy_version": 2 * s, **dict.fromkeys(STEP_FIELDS, 0.5)}
        for s in range(1, count + 1)
    ]
    records[-1].update(changed)
    return records


def test_equal_checkpoints_and_steps_pass_whatever_the_time_and_versions(tmp_path: Path) -> None:
    weight, moment = torch.randn(3, 2), torch.randn(3, 2)
    chaos = _checkpoint(tmp_path / "chaos", weight, moment)
    twin = _checkpoint(tmp_path / "twin", weight.clone(), moment.clone())
    theirs = [{**record, "time": 5.0, "policy_version": record["step"]} for record in _steps(2)]
    check = compare(chaos, twin, _steps(2), theirs)
    assert check.ok, check.found
    assert "weights equal bit for bit, AdamW state equal bit for bit" in check.found
    assert "2 of 2 steps' metrics compared, all equal" in check.found


def test_one_bit_of_one_weight_or_moment_fails(tmp_path: Path) -> None:
    weight, moment = torch.randn(3, 2), torch.randn(3, 2)
    chaos = _checkpoint(tmp_path / "chaos", weight, moment)
    nudged = weight.clone()
    nudged[1, 1] = torch.nextafter(nudged[1, 1], torch.tensor(float("inf")))
    check = compare(chaos, _checkpoint(tmp_path / "twin", nudged, moment), _steps(2), _steps(2))
    assert not check.ok
    assert "weights differ in 1: ['lm_head.weight']" in check.found
    check = compare(chaos, _checkpoint(tmp_path / "twin2", weight, moment * 1.5), _steps(2), _steps(2))
    assert not check.ok
    assert "AdamW state differ in 2: ['0.exp_avg', '0.exp_avg_sq']" in check.found


def test_a_step_that_trained_on_other_groups_or_a_missing_step_fails(tmp_path: Path) -> None:
    weight, moment = torch.randn(3, 2), torch.randn(3, 2)
    chaos = _checkpoint(tmp_path / "chaos", weight, moment)
    twin = _checkpoint(tmp_path / "twin", weight, moment)
    check = compare(chaos, twin, _steps(2), _steps(2, tokens_trained=7.0))
    assert not check.ok
    assert "differing at steps [2]" in check.found
    check = compare(chaos, twin, _steps(2), _steps(1))
    assert not check.ok
    assert "1 of 2 steps' metrics compared" in check.found
