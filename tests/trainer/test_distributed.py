"""The same loop under torchrun: two gloo processes on CPU give the weights of one process.

FSDP2 (`fully_shard` over the decoder layers and the base, the LM head replicated) runs on CPU/gloo in
torch 2.13 and is tested here, and so is the DDP-style replicated mode. Both ranks build the same
micro-batches from the groups rank 0 read, each runs half of them (padded to the same count) and the
averaged gradient is the one-process gradient; after two AdamW steps the gathered weights (written by
rank 0 into the step-2 checkpoint) match a one-process run to 2e-5 (float32; the all-reduce sums in a
different order than one process accumulates).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lodestar.local import free_port
from services.trainer.settings import TrainerSettings
from services.trainer.wiring import create_trainer
from tests.trainer.distributed_worker import GROUPS, SETTINGS
from tests.trainer.groups_helpers import FeedSource

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 2e-5


@pytest.fixture(scope="module")
def one_process(trainer_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("single")
    trainer = create_trainer(TrainerSettings(model=trainer_model_dir, run_dir=out, **SETTINGS), connect=False)  # type: ignore[arg-type]
    trainer.source = FeedSource(GROUPS)
    trainer.run()
    assert trainer.board.snapshot().step == 2, trainer.board.snapshot().error
    assert trainer.board.snapshot().last_record is not None
    return out


def step_metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "step-000002" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp2", "ddp"])
def test_two_gloo_ranks_match_one_process(
    mode: str, one_process: Path, trainer_model_dir: Path, tmp_path: Path
) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(REPO / "tests" / "trainer" / "distributed_worker.py"),
        str(trainer_model_dir), str(tmp_path), mode,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "rank 0/2: stopped step 2" in done.stdout
    assert "rank 1/2: stopped step 2" in done.stdout
    # AdamW hides a wrong gradient scale in the weights; the loss and the global gradient norm do not.
    for alone, ranks in zip(step_metrics(one_process), step_metrics(tmp_path), strict=True):
        for key in ("loss", "grad_norm", "target_tokens", "clip_fraction", "logprob_diff_max", "micro_batches"):
            assert ranks[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-7), key
    gathered, expected = weights(tmp_path), weights(one_process)
    assert gathered.keys() == expected.keys()
    initial = load_file(str(trainer_model_dir / "model.safetensors"))
    worst = max(float((gathered[name] - expected[name]).abs().max()) for name in gathered)
    assert worst <= TOLERANCE, f"largest weight difference {worst}"
    moved = max(float((expected[name] - initial[name]).abs().max()) for name in gathered)
    assert moved > 100 * TOLERANCE  # the steps changed the weights far more than the tolerance
    print(f"{mode}: largest difference {worst:.2e}, largest change {moved:.2e}")
