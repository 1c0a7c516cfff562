"""lodestar_app.local: predictable default ports for `lodestar up` (a free one when taken); the interpreter each
service runs under."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from lodestar_app.local import free_port, port_or_free


def test_port_or_free_keeps_a_free_preferred_port() -> None:
    port = free_port()
    assert port_or_free(port) == port


def test_port_or_free_moves_off_a_taken_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        chosen = port_or_free(busy)
        assert chosen != busy
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", chosen))  # really free


def test_the_vllm_backend_runs_under_the_vllm_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from lodestar_app.local import VLLM_PYTHON_ENV, ServiceSpec, service_python

    vllm = ServiceSpec("inference", 1, ["--backend", "vllm", "--model", "m"])
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "python"))
    assert service_python(vllm) == str(tmp_path / "python")
    assert service_python(ServiceSpec("inference-2", 2, ["--backend=vllm"], command="inference")) == str(
        tmp_path / "python"
    )
    # Every other service, and inference on another backend, runs under this interpreter.
    assert service_python(ServiceSpec("inference", 1, ["--backend", "transformers"])) == sys.executable
    assert service_python(ServiceSpec("gateway", 3, ["--backend", "vllm"])) == sys.executable
