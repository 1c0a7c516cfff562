"""SaveCheckpoint writes below the trainer's checkpoint directory only: a relative path is taken under it,
an absolute one must resolve (symlinks followed) below it, and the directory itself is refused (a save
replaces its target). Pure checks of `checkpoint_target`, then the RPC on a real trainer (tiny model, no
groups) behind its real gRPC server: a refused path writes nothing."""

from __future__ import annotations

from pathlib import Path

import grpc
import grpc.aio
import pytest

from lodestar.errors import InvalidArgumentError, PermissionDeniedError
from lodestar.v1 import trainer_pb2, trainer_pb2_grpc
from lodestar_trainer.runner import TrainerRunner, checkpoint_target
from lodestar_trainer.server import build_server
from lodestar_trainer.wiring import create_trainer
from tests.trainer.groups_helpers import RUN
from tests.trainer.helpers import trainer_settings


def test_checkpoint_target_stays_below_the_checkpoint_directory(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "escape").symlink_to(tmp_path / "elsewhere")
    assert checkpoint_target(Path("manual"), root) == (root / "manual").resolve()
    assert checkpoint_target(root / "a" / "b", root) == (root / "a" / "b").resolve()
    for outside in (Path("/etc/lodestar"), Path("../elsewhere"), tmp_path / "elsewhere", root / "escape" / "x"):
        with pytest.raises(PermissionDeniedError):
            checkpoint_target(outside, root)
    for itself in (root, Path("."), Path("a/..")):
        with pytest.raises(InvalidArgumentError):
            checkpoint_target(itself, root)


async def test_save_checkpoint_refuses_a_path_outside_and_writes_nothing(
    trainer_model_dir: Path, tmp_path: Path
) -> None:
    settings = trainer_settings(port=0, run=RUN, model=trainer_model_dir, run_dir=tmp_path / "run")
    runner = TrainerRunner(create_trainer(settings, connect=False))  # not started: no groups are read
    server = build_server(settings, runner)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            for path in (str(tmp_path / "stolen"), "../../stolen", "/proc/self/cwd/stolen"):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(path=path), timeout=60)
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, path
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SaveCheckpoint(
                    trainer_pb2.SaveCheckpointRequest(path=str(tmp_path / "run" / "checkpoints")), timeout=60
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert not (tmp_path / "stolen").exists()

            saved = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(path="manual"), timeout=120)
            assert Path(saved.path) == (tmp_path / "run" / "checkpoints" / "manual").resolve()
            assert (Path(saved.path) / "model.safetensors").is_file()
    finally:
        await server.stop(0)
        await runner.close()
