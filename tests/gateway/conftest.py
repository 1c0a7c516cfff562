"""Fixtures of the gateway tests (also used by the real-harness tests).

- `tiny_model_dir`: the tiny model (tokenizer + chat template) built once per test run.
- `gateway_stack`: a fresh scripted inference server + gateway node per test (`stack.GatewayStack`):
  `.http_base_url`, `.openai_base_url`, `.grpc_address`, `.open_session()`, `.calls(id)`, `.set_script()`.
- `gateway_stack_factory`: start more stacks (or with other gateway settings) inside one test.
- `session`: an open session on `gateway_stack`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lodestar_inference.tiny_model import TinyModelSpec, build
from tests.gateway.stack import GatewayStack, OpenedSession

StackFactory = Callable[..., GatewayStack]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("gateway-tiny-model"), TinyModelSpec())


@pytest.fixture
def gateway_stack_factory(tmp_path: Path, tiny_model_dir: Path) -> Iterator[StackFactory]:
    """`factory(script=None, *, inference=True, backend="scripted", **gateway_settings)` -> a started GatewayStack."""
    with contextlib.ExitStack() as stacks:
        count = 0

        def factory(
            script: dict[str, Any] | None = None, *, inference: bool = True, backend: str = "scripted", **gateway: Any
        ) -> GatewayStack:
            nonlocal count
            count += 1
            model_dir = tiny_model_dir if inference else None
            return stacks.enter_context(
                GatewayStack.start(tmp_path / f"stack{count}", model_dir, script=script, backend=backend, **gateway)
            )

        yield factory


@pytest.fixture
def gateway_stack(gateway_stack_factory: StackFactory) -> GatewayStack:
    return gateway_stack_factory()


@pytest.fixture
def session(gateway_stack: GatewayStack) -> OpenedSession:
    return gateway_stack.open_session(test="gateway")
