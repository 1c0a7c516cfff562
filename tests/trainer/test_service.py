"""A short real run: the real inference service (transformers, tiny model) sampled the calls, a RolloutService
stand-in (real gRPC server) streams their groups, the trainer serves TrainerService and trains: it pushes
weights (inference's next call reports the new version), reports versions to rollout, checkpoints,
stops, and a new trainer resumed from the checkpoint continues where it stopped."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc.aio
import pytest

from lodestar.v1 import common_pb2, inference_pb2, trainer_pb2, trainer_pb2_grpc
from lodestar_app.local import free_port
from lodestar_trainer.runner import TrainerRunner
from lodestar_trainer.server import build_server
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN, RolloutStandIn, group_from_calls, make_group, start_rollout
from tests.trainer.helpers import trainer_settings
from tests.trainer.inference_helpers import InferenceThread, generate, served_version, session_calls, text_message
from tests.waiting import eventually

REWARDS = (1.0, 0.0, 1.0, 0.0)
REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def inference(trainer_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceThread]:
    with InferenceThread.start(trainer_model_dir, tmp_path_factory.mktemp("spool")) as server:
        yield server


def real_group(address: str, index: int) -> object:
    sessions = [session_calls(address, f"g{index}-s{sample}", turns=2, seed=index * 10 + sample) for sample in range(4)]
    return group_from_calls(sessions, REWARDS, group_id=f"g{index}")


@pytest.mark.slow
async def test_real_run_pushes_checkpoints_stops_and_resumes(
    inference: InferenceThread, trainer_model_dir: Path, tmp_path: Path
) -> None:
    groups = [await asyncio.to_thread(real_group, inference.address, index) for index in range(3)]
    first_calls = groups[0].sessions[0].calls  # type: ignore[attr-defined]
    assert first_calls[1].continued_from_sequence == 0
    assert first_calls[0].policy_version == 0
    standin = RolloutStandIn(groups[:2], hold=True)
    rollout, rollout_address = await start_rollout(standin)
    settings = trainer_settings(
        port=0, run=RUN, model=trainer_model_dir, rollout=rollout_address, inference=inference.address,
        run_dir=tmp_path / "run", lr=1e-3, checkpoint_every=1, micro_batch_tokens=512,
    )  # fmt: skip
    runner = TrainerRunner(await asyncio.to_thread(create_trainer, settings))
    server = build_server(settings, runner)
    port = await server.start()
    await server.set_serving(True)
    runner.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            await _check_two_steps_streamed(stub, tmp_path / "run")
            await eventually(
                lambda: standin.reported, 60, what="steps 1 and 2 reported", until=lambda steps: steps == [1, 2]
            )

            status = await eventually(  # step 2's checkpoint is being written
                lambda: stub.GetStatus(trainer_pb2.GetStatusRequest(), timeout=10),
                60,
                what="the trainer WAITING",
                until=lambda status: status.state == trainer_pb2.TRAINER_STATE_WAITING,
            )
            assert (status.step, status.policy_version, status.run_id) == (2, 2, RUN)
            assert status.state == trainer_pb2.TRAINER_STATE_WAITING
            assert status.error == ""
            assert status.last_metrics.step == 2
            assert status.last_checkpoint_path.endswith("step-000002")
            assert served_version(inference.address) == 2
            request = inference_pb2.GenerateRequest(
                messages=[text_message(common_pb2.ROLE_USER, "Next task.")],
                sampling=common_pb2.SamplingParams(max_tokens=2, seed=1),
            )
            assert (await asyncio.to_thread(generate, inference.address, request)).policy_version == 2

            await _check_save_checkpoint(stub, tmp_path)

            stopped = await stub.Stop(trainer_pb2.StopRequest(save_checkpoint=True), timeout=60)
            assert stopped.state == trainer_pb2.TRAINER_STATE_STOPPED
            assert stopped.checkpoint_path.endswith("step-000002")
            final = await stub.GetStatus(trainer_pb2.GetStatusRequest(), timeout=10)
            assert final.state == trainer_pb2.TRAINER_STATE_STOPPED
            # A stopped trainer's metric stream gives the latest step and ends.
            replies = [reply async for reply in stub.StreamMetrics(trainer_pb2.StreamMetricsRequest(), timeout=10)]
            assert [reply.metrics.step for reply in replies] == [2]
    finally:
        await runner.close()
        await server.stop(0)

    # A fresh trainer resumed from the checkpoint reads the stream after the 2 groups it already trained on.
    standin.groups.append(groups[2])
    standin.added.set()
    resumed_settings = settings.model_copy(update={"resume": Path(stopped.checkpoint_path), "steps": 1})
    resumed = await asyncio.to_thread(create_trainer, resumed_settings)
    await asyncio.to_thread(resumed.run)
    status_after = resumed.board.snapshot()
    assert (status_after.step, status_after.policy_version) == (3, 3), status_after.error
    assert standin.requests[-1].start_after == 2
    assert standin.requests[-1].tokens_only
    assert served_version(inference.address) == 3
    assert standin.reported[-1] == 3
    await rollout.stop(0)


async def _check_two_steps_streamed(stub: trainer_pb2_grpc.TrainerServiceStub, run_dir: Path) -> None:
    """StreamMetrics reaches step 2; step 1 trained on fresh calls with no same-version gap, step 2 on calls one
    version stale (drift, no gap)."""
    stream = stub.StreamMetrics(trainer_pb2.StreamMetricsRequest(), timeout=120)
    seen = []
    async for reply in stream:
        seen.append(reply.metrics)
        if reply.metrics.step == 2:
            break
    stream.cancel()
    assert seen[-1].step == 2  # the stream starts at the latest step (1 or 2, by timing)
    assert seen[-1].policy_version == 2
    assert seen[-1].values["merge_ratio"] > 1.0
    step_1 = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    # Step 1 trains on calls of version 0 with the weights inference sampled them with: no gap. Step 2's
    # calls are one version stale, so the trainer's logprobs moved away from the captured ones: drift.
    assert step_1["logprob_diff_max"] < 1e-4
    assert step_1["staleness_max"] == 0
    assert seen[-1].values["policy_drift_max"] > 1e-3
    assert "logprob_diff_max" not in seen[-1].values, "a step of stale tokens has no same-version gap"
    assert seen[-1].values["staleness_max"] == 1
    # The trainer process's peak memory: the tiny model's trainer is a Python process with torch, 100s of MB.
    assert 100 < step_1["memory_peak_mb"] <= seen[-1].values["memory_peak_mb"] < 24 * 1024


async def _check_save_checkpoint(stub: trainer_pb2_grpc.TrainerServiceStub, tmp_path: Path) -> None:
    """SaveCheckpoint writes below the checkpoint directory only (a relative path is taken under it)."""
    for outside in (str(tmp_path / "manual"), "../../manual", "/etc/lodestar"):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(path=outside), timeout=60)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, outside
    assert not (tmp_path / "manual").exists()
    manual = (tmp_path / "run" / "checkpoints" / "manual").resolve()
    saved = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(path="manual"))
    assert (saved.path, saved.step) == (str(manual), 2)
    assert (manual / "model.safetensors").is_file()


@pytest.mark.slow
async def test_cli_serve_trains_from_a_config_table_and_drains_on_sigterm(
    trainer_model_dir: Path, tmp_path: Path
) -> None:
    standin = RolloutStandIn([make_group(0)], hold=True)
    rollout, rollout_address = await start_rollout(standin)
    config = tmp_path / "lodestar.toml"
    config.write_text(
        f'[trainer]\nrun = "{RUN}"\nsteps = 1\ninference = ""\nrollout = "{rollout_address}"\n'
        f'run_dir = "{tmp_path / "run"}"\n[trainer.batch]\nbuilder = "tree"\nmicro_batch_tokens = 4096\n'
    )
    port = free_port()
    command = [sys.executable, "-m", "lodestar_app.cli.main", "trainer", "serve", "--config", str(config),
               "--model", str(trainer_model_dir), "--port", str(port), "--log-json"]  # fmt: skip
    log = tmp_path / "trainer.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *command, cwd=REPO, stdout=output, stderr=asyncio.subprocess.STDOUT, env=ENV
        )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            status = None
            for _ in range(1200):
                assert process.returncode is None, log.read_text()[-3000:]
                try:
                    status = await stub.GetStatus(trainer_pb2.GetStatusRequest(), timeout=2)
                except grpc.aio.AioRpcError:
                    status = None
                if status is not None and status.state == trainer_pb2.TRAINER_STATE_STOPPED:
                    break
                await asyncio.sleep(0.1)
            assert status is not None, log.read_text()[-3000:]
            assert status.state == trainer_pb2.TRAINER_STATE_STOPPED, log.read_text()[-3000:]
            assert (status.step, status.run_id) == (1, RUN)
            assert status.last_metrics.values["sequences"] == 1  # tree: the whole group is one sequence
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await rollout.stop(0)
    assert standin.reported == [1]


async def test_an_idle_trainer_answers_every_rpc(tmp_path: Path) -> None:
    server = build_server(trainer_settings(port=0, run_dir=tmp_path))
    port = await server.start()
    await server.set_serving(True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            status = await stub.GetStatus(trainer_pb2.GetStatusRequest(), timeout=10)
            assert status.state == trainer_pb2.TRAINER_STATE_WAITING
            assert "--run RUN_ID --model DIR" in status.error
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            stopped = await stub.Stop(trainer_pb2.StopRequest(), timeout=10)
            assert stopped.state == trainer_pb2.TRAINER_STATE_STOPPED
    finally:
        await server.stop(0)
