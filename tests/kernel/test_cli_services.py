"""`lodestar <service> serve` from the typed registry; `lodestar inference serve` without --model builds the
embedded tiny model on first use and serves it (a real process, a real gRPC client)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from lodestar.v1 import inference_pb2, inference_pb2_grpc
from lodestar_app.cli.services import REGISTRY
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


def test_registry_names_every_service_with_its_settings() -> None:
    assert [service.name for service in REGISTRY] == ["inference", "gateway", "rollout", "trainer"]
    assert all(service.settings.section == service.name for service in REGISTRY)


@pytest.mark.slow
def test_inference_serve_without_model_serves_the_tiny_model(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "lodestar_app.cli.main", "inference", "serve", "--port", str(port)]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        info = _model_info(f"127.0.0.1:{port}", deadline=time.monotonic() + 180)
        assert info.model_name == "tiny-model"
        assert info.vocab_size > 0
        assert (tmp_path / ".lodestar" / "tiny-model" / "config.json").is_file()
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output.decode()[-3000:]
    assert b"building the embedded tiny model" in output


def _model_info(target: str, deadline: float) -> inference_pb2.GetModelInfoResponse:
    with grpc.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        while True:
            try:
                return stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=5)
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
