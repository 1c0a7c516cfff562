"""UpdateWeights within limits, on a real in-process InferenceService (scripted engine, the tiny model's
tokenizer) behind its real gRPC server:

- a `checkpoint_path` is loaded only from under `--checkpoint-dirs` (resolved: a symlink out of an allowed
  directory, or a file of it that links out, does not let a caller out); by default none is allowed;
  outside is PERMISSION_DENIED, a relative path INVALID_ARGUMENT, and the served version does not move;
- a streamed update announcing more than `--max-weights-bytes` is refused before a byte is spooled;
  by default the limit is twice the model's safetensors files plus 64 MiB.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import torch
from safetensors.torch import save_file

from lodestar.v1 import inference_pb2, inference_pb2_grpc
from lodestar_inference.server import build_server
from lodestar_inference.service import InferenceService
from lodestar_inference.settings import InferenceSettings
from lodestar_inference.weights import upload_limit
from tests.inference.helpers import safetensors_bytes, weight_stream

MiB = 1024 * 1024


Update = inference_pb2.UpdateWeightsRequest


async def _stream(items: Iterable[Update]) -> AsyncIterator[Update]:
    for item in items:
        yield item


def _checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True)
    save_file({"w": torch.zeros(4)}, str(directory / "model.safetensors"))
    return directory


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    allowed = _checkpoint(tmp_path / "checkpoints" / "step-1")
    outside = _checkpoint(tmp_path / "elsewhere" / "ckpt")
    (tmp_path / "checkpoints" / "escape").symlink_to(outside)  # a symlink out of the allowed directory
    linked = tmp_path / "checkpoints" / "linked-file"
    linked.mkdir()
    (linked / "model.safetensors").symlink_to(outside / "model.safetensors")  # a file that links out
    return {"root": tmp_path / "checkpoints", "allowed": allowed, "outside": outside, "linked": linked}


async def _served(settings: InferenceSettings) -> tuple[Any, InferenceService, int]:
    service = InferenceService.create(settings)
    server = build_server(settings, service)
    port = await server.start()
    await service.start()
    await server.set_serving(True)
    return server, service, port


async def _version(stub: inference_pb2_grpc.InferenceServiceStub) -> int:
    info = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=10)
    return int(info.policy_version.version)


async def _refused(stub: inference_pb2_grpc.InferenceServiceStub, path: str) -> grpc.StatusCode:
    request = inference_pb2.UpdateWeightsRequest(checkpoint_path=path)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.UpdateWeights(_stream([request]), timeout=30)
    code: grpc.StatusCode = refused.value.code()
    return code


async def test_checkpoint_paths_are_confined_to_the_configured_directories(
    tiny_model_dir: Path, dirs: dict[str, Path], tmp_path: Path
) -> None:
    settings = InferenceSettings(
        backend="scripted", model=tiny_model_dir, port=0, checkpoint_dirs=[dirs["root"]], weights_spool_dir=tmp_path
    )
    server, service, port = await _served(settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            for path in (dirs["outside"], dirs["root"] / "escape", dirs["linked"], Path("/etc"), tiny_model_dir):
                assert await _refused(stub, str(path)) == grpc.StatusCode.PERMISSION_DENIED, path
            assert await _refused(stub, "../elsewhere/ckpt") == grpc.StatusCode.INVALID_ARGUMENT
            assert await _version(stub) == 0

            request = inference_pb2.UpdateWeightsRequest(checkpoint_path=str(dirs["allowed"]))
            reply = await stub.UpdateWeights(_stream([request]), timeout=30)
            assert (reply.policy_version, reply.tensors_updated) == (1, 1)
            assert await _version(stub) == 1
    finally:
        await server.stop(0)
        await service.close()


async def test_without_checkpoint_dirs_every_checkpoint_path_is_refused(
    tiny_model_dir: Path, dirs: dict[str, Path], tmp_path: Path
) -> None:
    settings = InferenceSettings(backend="scripted", model=tiny_model_dir, port=0, weights_spool_dir=tmp_path)
    assert settings.checkpoint_dirs == []
    server, service, port = await _served(settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            for path in (dirs["allowed"], tiny_model_dir):
                assert await _refused(stub, str(path)) == grpc.StatusCode.PERMISSION_DENIED
            assert await _version(stub) == 0
    finally:
        await server.stop(0)
        await service.close()


async def test_an_upload_above_the_limit_is_refused_before_it_is_spooled(tiny_model_dir: Path, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    settings = InferenceSettings(
        backend="scripted", model=tiny_model_dir, port=0, weights_spool_dir=spool, max_weights_bytes=1 * MiB
    )
    payload = safetensors_bytes({"w": torch.zeros(4)})
    server, service, port = await _served(settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            for total in (1 * MiB + 1, 1 << 40):  # the header alone decides: nothing is written
                header = inference_pb2.WeightsHeader(total_bytes=total)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.UpdateWeights(_stream([inference_pb2.UpdateWeightsRequest(header=header)]), timeout=30)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "--max-weights-bytes" in (refused.value.details() or "")
            big = b"\0" * (2 * MiB)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.UpdateWeights(_stream(weight_stream(big)), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert list(spool.iterdir()) == []
            assert await _version(stub) == 0

            reply = await stub.UpdateWeights(_stream(weight_stream(payload)), timeout=30)  # within the limit
            assert reply.policy_version == 1
            assert list(spool.iterdir()) == []
    finally:
        await server.stop(0)
        await service.close()


def test_the_default_upload_limit_follows_the_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    weights = sum(file.stat().st_size for file in tiny_model_dir.glob("*.safetensors"))
    assert weights > 0
    assert upload_limit(tiny_model_dir, 0) == 2 * weights + 64 * MiB
    assert upload_limit(tiny_model_dir, 5 * MiB) == 5 * MiB
    assert upload_limit(tmp_path, 0) == 64 * MiB  # no weights there
