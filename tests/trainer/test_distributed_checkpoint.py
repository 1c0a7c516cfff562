"""Distributed checkpoints: `lodestar trainer serve` under torchrun (2 gloo ranks, FSDP2, tied embeddings)
answers SaveCheckpoint while it waits for groups, every rank writes its shard (torch.distributed.checkpoint),
and a run resumed from that checkpoint continues exactly like the uninterrupted one.

Run A trains 2 steps (one group each), is asked for a checkpoint while waiting for the third group, gets 2
more groups, trains steps 3-4 and stops with a checkpoint. Run B resumes from A's step-2 checkpoint on 2
ranks and trains steps 3-4 on the same groups: losses and weights equal A's bit for bit (same ranks, same
order of operations). One process resumed from the same checkpoint (DCP reshards 2 ranks into 1) matches
to float32 summation order, and the checkpoint's Hugging Face export (what inference loads) holds exactly
the sharded weights.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import grpc.aio
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from lodestar.v1 import trainer_pb2, trainer_pb2_grpc
from lodestar_app.local import free_port
from lodestar_trainer.checkpoint import SHARDED_DIR, load_checkpoint
from lodestar_trainer.settings import MOVED
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN, FeedSource, RolloutStandIn, make_group, start_rollout
from tests.trainer.helpers import trainer_settings
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
GROUPS = [make_group(seed) for seed in range(4)]
RPC_S = 120


def _toml(values: dict[str, object]) -> str:
    """A [trainer] table from the tests' flat shorthand: a key of a section (settings.MOVED) goes to its table."""
    tables: dict[str, list[str]] = {"trainer": []}
    for key, value in values.items():
        section, _, name = MOVED.get(key, key).rpartition(".")
        table = f"trainer.{section}" if section else "trainer"
        tables.setdefault(table, []).append(f"{name} = {json.dumps(value)}\n")
    return "".join(f"[{table}]\n" + "".join(lines) for table, lines in tables.items())


class ServedRanks:
    """`lodestar trainer serve` on 2 gloo ranks under torchrun; TrainerService on rank 0's `port`."""

    def __init__(self, process: asyncio.subprocess.Process, port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log

    @classmethod
    async def start(cls, tmp_path: Path, name: str, table: dict[str, object]) -> ServedRanks:
        port = free_port()
        config = tmp_path / f"{name}.toml"
        values = {**table, "run": RUN, "port": port, "inference": "", "lr": 1e-3, "micro_batch_tokens": 160,
                  "groups_per_step": 1, "parallel": "fsdp2"}  # fmt: skip
        config.write_text(_toml(values))
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "LODESTAR_CONFIG": str(config)}  # fmt: skip
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                   "127.0.0.1", "--master-port", str(free_port()), "-m", "lodestar_app.cli.main", "trainer",
                   "serve"]  # fmt: skip
        log = tmp_path / f"{name}.log"
        with log.open("wb") as output:
            process = await asyncio.create_subprocess_exec(
                *command, cwd=REPO, stdout=output, stderr=asyncio.subprocess.STDOUT, env=env
            )
        return cls(process, port, log)

    async def at_step(self, stub: trainer_pb2_grpc.TrainerServiceStub, step: int) -> trainer_pb2.GetStatusResponse:
        async def status() -> trainer_pb2.GetStatusResponse | None:
            assert self.process.returncode is None, self.log.read_text()[-4000:]
            try:
                answer: trainer_pb2.GetStatusResponse = await stub.GetStatus(trainer_pb2.GetStatusRequest(), timeout=5)
            except grpc.aio.AioRpcError:
                return None
            assert answer.state != trainer_pb2.TRAINER_STATE_FAILED, answer.error
            return answer

        def waiting_at_step(answer: trainer_pb2.GetStatusResponse | None) -> bool:
            return answer is not None and answer.step == step and answer.state == trainer_pb2.TRAINER_STATE_WAITING

        answer: trainer_pb2.GetStatusResponse = await eventually(
            status, 240, interval_s=0.2, what=f"step {step} done", until=waiting_at_step
        )
        return answer

    async def stop(self, stub: trainer_pb2_grpc.TrainerServiceStub) -> Path:
        """Stop with a checkpoint (rank 1 exits; rank 0 serves on), SIGTERM to rank 0: torchrun exits 0.
        Returns the checkpoint."""
        stopped = await stub.Stop(trainer_pb2.StopRequest(save_checkpoint=True), timeout=RPC_S)
        assert stopped.state == trainer_pb2.TRAINER_STATE_STOPPED
        os.kill(rank_zero(self.process.pid), signal.SIGTERM)
        assert await asyncio.wait_for(self.process.wait(), 120) == 0, self.log.read_text()[-4000:]
        return Path(stopped.checkpoint_path)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def rank_zero(torchrun: int) -> int:
    """The pid of torchrun's worker with LOCAL_RANK=0."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == torchrun and b"LOCAL_RANK=0" in environ:
            return int(entry.name)
    raise AssertionError(f"no rank-0 worker under torchrun {torchrun}")


def metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
async def test_sharded_checkpoint_under_torchrun_resumes_exactly(tied_model_dir: Path, tmp_path: Path) -> None:
    standin = RolloutStandIn(GROUPS[:2], hold=True)
    rollout, address = await start_rollout(standin)
    try:
        ranks = await ServedRanks.start(tmp_path, "a", {"model": str(tied_model_dir), "rollout": address,
                                                       "run_dir": str(tmp_path / "a")})  # fmt: skip
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{ranks.port}") as channel:
                stub = trainer_pb2_grpc.TrainerServiceStub(channel)
                await ranks.at_step(stub, 2)  # and waiting for a third group that is not there
                saved = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(path="manual"), timeout=RPC_S)
                assert saved.step == 2
                standin.groups.extend(GROUPS[2:])
                standin.added.set()
                await ranks.at_step(stub, 4)
                straight = await ranks.stop(stub)
        finally:
            await ranks.kill()
        manual = Path(saved.path)
        assert manual == (tmp_path / "a" / "checkpoints" / "manual").resolve()
        shards = sorted(path.name for path in (manual / SHARDED_DIR).iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # every rank wrote its own
        assert not (manual / "optimizer.pt").exists()
        assert (manual / "rng.pt").is_file()
        assert (manual / "rng-rank1.pt").is_file()
        assert straight.name == "step-000004"

        standin_b = RolloutStandIn(GROUPS, hold=True)
        rollout_b, address_b = await start_rollout(standin_b)
        ranks = await ServedRanks.start(tmp_path, "b", {"resume": str(manual), "rollout": address_b,
                                                       "run_dir": str(tmp_path / "b")})  # fmt: skip
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{ranks.port}") as channel:
                stub = trainer_pb2_grpc.TrainerServiceStub(channel)
                await ranks.at_step(stub, 4)
                resumed = await ranks.stop(stub)
        finally:
            await ranks.kill()
            await rollout_b.stop(0)
        assert standin_b.requests[0].start_after == 2
    finally:
        await rollout.stop(0)

    straight_steps, resumed_steps = metrics(tmp_path / "a")[2:], metrics(tmp_path / "b")
    assert [m["step"] for m in resumed_steps] == [3, 4]
    for a, b in zip(straight_steps, resumed_steps, strict=True):
        for key in ("loss", "grad_norm", "clip_fraction", "logprob_diff_max", "policy_drift_max"):
            assert a.get(key) == b.get(key), key
    expected, got = load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert expected.keys() == got.keys()
    assert "lm_head.weight" not in expected  # tied: the embedding is the head
    assert all(torch.equal(expected[name], got[name]) for name in expected)

    # One process resumes the 2-rank checkpoint (DCP reshards); its export is the sharded state exactly.
    settings = trainer_settings(run=RUN, resume=manual, run_dir=tmp_path / "c", lr=1e-3, micro_batch_tokens=160,
                               groups_per_step=1, steps=2)  # fmt: skip
    alone = create_trainer(settings, connect=False)
    assert load_checkpoint(manual).sharded is not None
    export = AutoModelForCausalLM.from_pretrained(manual, dtype=torch.float32)
    exported = dict(export.named_parameters())
    assert all(torch.equal(param, exported[name]) for name, param in alone.model.named_parameters())
    assert alone.optimizer.state  # AdamW moments came from the shards
    alone.source = FeedSource(GROUPS)
    alone.run()
    assert alone.board.snapshot().step == 4, alone.board.snapshot().error
    state = {name: tensor for name, tensor in alone.model.state_dict().items() if name in expected}
    worst = max(float((state[name] - expected[name]).abs().max()) for name in expected)
    assert worst <= 2e-5, f"one process off the 2-rank run by {worst}"
