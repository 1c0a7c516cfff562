"""Inference servers as subprocesses, for the benchmarks and the tests: `serve_inference` runs
`lodestar inference serve` on a backend until the block ends, `run_server` any gRPC server that serves health.

Each server runs from a checkout (`repo`: benchmarks compare against another commit's worktree) with its
output in a log file, must report SERVING within its start timeout, and is stopped with SIGTERM (then killed).
No pytest here: tests/inference/conftest.py turns a missing .venv-vllm into a skip (`VenvMissing`).
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
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lodestar_app.local import free_port

REPO = Path(__file__).resolve().parents[1]
PYTHONS = {
    "transformers": REPO / ".venv" / "bin" / "python",
    "scripted": REPO / ".venv" / "bin" / "python",
    "vllm": REPO / ".venv-vllm" / "bin" / "python",
}
"""The interpreter each backend's server runs under (vLLM has a virtualenv of its own)."""
START_TIMEOUT_S = {"transformers": 90.0, "scripted": 60.0, "vllm": 240.0}


class VenvMissing(RuntimeError):
    """The backend's virtualenv is not there (.venv-vllm: `make vllm-venv`)."""


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


def backend_python(backend: str) -> Path:
    """The backend's interpreter; VenvMissing for vllm without .venv-vllm (others fall back to this one)."""
    python = PYTHONS[backend]
    if backend == "vllm" and not python.exists():
        raise VenvMissing(".venv-vllm missing (make vllm-venv)")
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
    backend: str, model_dir: Path, log_dir: Path, *extra: str, repo: Path = REPO, port: int | None = None
) -> Iterator[ServerProcess]:
    """Run `lodestar inference serve` as a subprocess until the block ends (SIGTERM, then kill). `repo`: the
    checkout whose code runs (benchmarks compare against another commit's worktree); `port`: a free one unless
    given (a restart at the same address)."""
    python = backend_python(backend)
    port = free_port() if port is None else port
    command = [
        str(python),
        "-m",
        "lodestar_app.cli.main",
        "inference",
        "serve",
        *("--backend", backend, "--model", str(model_dir), "--port", str(port), "--log-json"),
        *extra,
    ]
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
