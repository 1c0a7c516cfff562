"""The same loop under torchrun: two gloo processes on CPU give the gradients and weights of one process.

FSDP2 (`fully_shard` over the decoder layers and the base, the LM head replicated, or with tied embeddings
the head reading the gathered embedding) runs on CPU/gloo in torch 2.13 and is tested here, and so is the
DDP-style replicated mode. Both ranks build the same micro-batches from the groups rank 0 read, each runs
half of them (padded to the same count) and the averaged gradient is the one-process gradient: the first
step's gradient as the optimizer sees it matches to 1e-5 relative to its largest entry, and after two AdamW
steps the gathered weights (written by rank 0 into the step-2 checkpoint) match a one-process run to 2e-5
wherever AdamW is well-conditioned (first gradient >= 100x the gradient bound), and everywhere within what
AdamW can move an entry in two steps (float32; the all-reduce sums in a different order than one process
accumulates, and on a CPU with AVX-512 the one-process run itself sums differently: an entry with a tiny
gradient then took a step 2.4e-5 off, deterministically).
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

from lodestar_app.local import free_port
from lodestar_trainer.wiring import create_trainer
from tests.trainer.distributed_worker import GRADIENTS_FILE, GROUPS, SETTINGS, capture_first_gradients
from tests.trainer.groups_helpers import FeedSource
from tests.trainer.helpers import trainer_settings

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 2e-5
GRADIENT_TOLERANCE = 1e-5
CONDITIONED = 100
"""Weights are compared to TOLERANCE where the first gradient is at least CONDITIONED times the gradient check's
bound (GRADIENT_TOLERANCE * largest entry): there the gradient is known to 1 / CONDITIONED relative, and AdamW's
scale-free step (m / sqrt(v)) moves by at most ~lr / CONDITIONED per step: 2 steps * 1e-3 / 100 = TOLERANCE."""
"""Largest gradient difference relative to the largest gradient entry."""


def torchrun(script: str, *args: object, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Two gloo ranks of `tests/trainer/<script>` under torchrun on CPU."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(REPO / "tests" / "trainer" / script), *map(str, args),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def one_process_run(model_dir: Path, out: Path) -> Path:
    trainer = create_trainer(trainer_settings(model=model_dir, run_dir=out, **SETTINGS), connect=False)
    capture_first_gradients(trainer, out)
    trainer.source = FeedSource(GROUPS)
    trainer.run()
    assert trainer.board.snapshot().step == 2, trainer.board.snapshot().error
    return out


@pytest.fixture(scope="module")
def one_process(trainer_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_process_run(trainer_model_dir, tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def one_process_tied(tied_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_process_run(tied_model_dir, tmp_path_factory.mktemp("single-tied"))


def step_metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "step-000002" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "tied"), [("fsdp2", False), ("ddp", False), ("fsdp2", True)])
def test_two_gloo_ranks_match_one_process(
    mode: str, tied: bool, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model_dir: Path = request.getfixturevalue("tied_model_dir" if tied else "trainer_model_dir")
    alone_dir: Path = request.getfixturevalue("one_process_tied" if tied else "one_process")
    done = torchrun("distributed_worker.py", model_dir, tmp_path, mode)
    assert "rank 0/2: stopped step 2" in done.stdout
    assert "rank 1/2: stopped step 2" in done.stdout

    # The gradient itself, before AdamW (which hides a wrong scale: it divides by the gradient's RMS).
    grads, expected_grads = torch.load(tmp_path / GRADIENTS_FILE), torch.load(alone_dir / GRADIENTS_FILE)
    assert grads.keys() == expected_grads.keys()
    if tied:
        assert "lm_head.weight" not in grads  # one parameter, trained through both uses
    largest = max(float(grad.abs().max()) for grad in expected_grads.values())
    off = max(float((grads[name] - expected_grads[name]).abs().max()) for name in grads)
    assert off <= GRADIENT_TOLERANCE * largest, f"gradient off by {off:.2e} (largest entry {largest:.2e})"

    for alone, ranks in zip(step_metrics(alone_dir), step_metrics(tmp_path), strict=True):
        for key in ("loss", "grad_norm", "target_tokens", "clip_fraction", "logprob_diff_max", "policy_drift_max",
                    "micro_batches"):  # fmt: skip
            assert (key in ranks) == (key in alone), key
            if key in alone:
                assert ranks[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-7), key
    gathered, expected = weights(tmp_path), weights(alone_dir)
    assert gathered.keys() == expected.keys()
    initial = load_file(str(model_dir / "model.safetensors"))
    # AdamW's step m / sqrt(v) does not scale with the gradient: in an entry whose gradient is as small as the
    # rounding difference (another summation order: AVX-512 against AVX2) that difference becomes a step
    # difference up to lr. Entries with a first gradient >= CONDITIONED times the gradient bound are compared to
    # TOLERANCE; every entry is bounded by what AdamW can move it in the run's steps (~lr per step, twice).
    conditioned = CONDITIONED * GRADIENT_TOLERANCE * largest
    worst, anywhere = 0.0, 0.0
    for name in gathered:
        diff = (gathered[name] - expected[name]).abs()
        anywhere = max(anywhere, float(diff.max()))
        first = expected_grads.get(name)
        if first is not None and first.shape == diff.shape:
            diff = diff[first.abs() >= conditioned]
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    assert worst <= TOLERANCE, f"largest weight difference {worst} where AdamW is well-conditioned"
    assert anywhere <= 2 * SETTINGS["lr"] * SETTINGS["steps"], f"largest weight difference {anywhere}"
    moved = max(float((expected[name] - initial[name]).abs().max()) for name in gathered)
    assert moved > 100 * TOLERANCE  # the steps changed the weights far more than the tolerance
    print(f"{mode}{' tied' if tied else ''}: gradient off {off:.2e} of {largest:.2e}, weights off {worst:.2e}, "
          f"moved {moved:.2e}")  # fmt: skip
