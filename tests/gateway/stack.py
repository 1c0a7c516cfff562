"""A real inference server (scripted engine, tiny tokenizer) plus a real gateway node, in-process.

Both run on their own event loop in a background thread, exactly as they would in their own process:
tests talk to them only over the network (HTTP for the vendor APIs, gRPC for GatewayService), so sync
clients (the SDKs, harness subprocesses) and async tests can use the same stack.

    with GatewayStack.start(tmp_path, model_dir, script={"replies": [...]}) as stack:
        session = stack.open_session()
        OpenAI(base_url=stack.openai_base_url, api_key=session.key)...
        calls = stack.calls(session.session_id)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from lodestar.grpc import security
from lodestar.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from lodestar_gateway.server import GatewayNode
from lodestar_gateway.settings import GatewaySettings
from lodestar_inference.server import build_server
from lodestar_inference.service import InferenceService
from lodestar_inference.settings import InferenceSettings

T = TypeVar("T")


@dataclass(frozen=True)
class OpenedSession:
    session_id: str
    key: str
    """The API key a client must send."""


class GatewayStack:
    """Handles to a running inference + gateway pair (see the module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        model_dir: Path | None,
        script: dict[str, Any] | None,
        *,
        backend: str = "scripted",
        **gateway: Any,
    ) -> None:
        self.data_dir = data_dir
        self._backend = backend
        self.script_path = data_dir / "script.json"
        self._model_dir = model_dir
        self._gateway_overrides = gateway
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway-stack", daemon=True)
        self._inference: Any = None
        self._inference_service: InferenceService | None = None
        self.node: GatewayNode | None = None
        self.inference_address = ""
        self._channel: grpc.Channel | None = None
        self._script_version = 0
        self.set_script(script or {})

    # Lifecycle -----------------------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        data_dir: Path,
        model_dir: Path | None,
        *,
        script: dict[str, Any] | None = None,
        backend: str = "scripted",
        **gateway: Any,
    ) -> Iterator[GatewayStack]:
        """Run a stack for the duration of the block. `model_dir=None` starts NO inference server (the
        gateway points at a closed port: every model call meets an unavailable backend). `backend`
        "transformers" serves the model for real (sampling, logprobs) instead of the script. `gateway`
        overrides GatewaySettings fields (e.g. max_body_bytes)."""
        stack = cls(data_dir, model_dir, script, backend=backend, **gateway)
        stack._thread.start()
        try:
            stack._run(stack._start())
            yield stack
        finally:
            stack.stop()

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the stack's loop (where the node's objects live) and return its result."""
        return self._run(coroutine, timeout)

    async def _start(self) -> None:
        if self._model_dir is not None:
            settings = InferenceSettings(
                port=0, backend=self._backend, model=self._model_dir, script=self.script_path, max_new_tokens=512
            )
            self._inference_service = InferenceService.create(settings)
            self._inference = build_server(settings, self._inference_service)
            port = await self._inference.start()
            await self._inference_service.start()
            await self._inference.set_serving(True)
            self.inference_address = f"127.0.0.1:{port}"
        else:
            from tests.conftest import free_port

            self.inference_address = f"127.0.0.1:{free_port()}"
        fields: dict[str, Any] = {
            "port": 0,
            "http_port": 0,
            "inference": self.inference_address,
            "data_dir": self.data_dir / "gateway",
            "drain_seconds": 1.0,
        }
        fields.update(self._gateway_overrides)
        self.node = GatewayNode(GatewaySettings(**fields))
        await self.node.start()

    async def _stop(self) -> None:
        if self.node is not None:
            await self.node.stop(grace=1.0)
        if self._inference is not None:
            await self._inference.stop(0.5)
        if self._inference_service is not None:
            await self._inference_service.close()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        if self._channel is not None:
            self._channel.close()
        with contextlib.suppress(Exception):
            self._run(self._stop(), timeout=30.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10.0)

    def restart_gateway(self) -> None:
        """Stop the gateway node and start a new one on the same data directory (and new ports)."""
        assert self.node is not None
        self._run(self.node.stop(grace=1.0))
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        settings = self.node.settings

        async def start() -> GatewayNode:
            node = GatewayNode(settings)  # grpc.aio servers must be built on the loop that runs them
            await node.start()
            return node

        self.node = self._run(start())

    # Addresses -----------------------------------------------------------------------------------------

    @property
    def http_base_url(self) -> str:
        """Vendor-API base URL without a version (Anthropic and Google SDKs, Claude Code, Gemini CLI)."""
        assert self.node is not None
        return self.node.http_base_url

    @property
    def openai_base_url(self) -> str:
        """OpenAI-style base URL (`…/v1`)."""
        return f"{self.http_base_url}/v1"

    @property
    def grpc_address(self) -> str:
        """GatewayService address (host:port)."""
        assert self.node is not None
        return self.node.grpc_address

    # Script and sessions -------------------------------------------------------------------------------

    def set_script(self, script: dict[str, Any]) -> None:
        """Replace the scripted engine's replies (it re-reads the file when its mtime changes)."""
        self.script_path.parent.mkdir(parents=True, exist_ok=True)
        self.script_path.write_text(json.dumps(script))
        self._script_version += 1
        stamp = time.time() + self._script_version
        os.utime(self.script_path, (stamp, stamp))

    def stub(self) -> gateway_pb2_grpc.GatewayServiceStub:
        if self._channel is None:
            self._channel = security.current().sync_channel(self.grpc_address)  # the token, when one is set
        return gateway_pb2_grpc.GatewayServiceStub(self._channel)

    def open_session(self, sampling_policy: common_pb2.SamplingPolicy | None = None, **labels: str) -> OpenedSession:
        request = gateway_pb2.OpenSessionRequest(labels=labels, sampling_policy=sampling_policy)
        response = self.stub().OpenSession(request, timeout=10)
        return OpenedSession(response.session.session_id, response.session.session_key)

    def close_session(self, session_id: str) -> gateway_pb2.Session:
        return self.stub().CloseSession(gateway_pb2.CloseSessionRequest(session_id=session_id), timeout=10).session

    def get_session(self, session_id: str) -> gateway_pb2.GetSessionResponse:
        return self.stub().GetSession(gateway_pb2.GetSessionRequest(session_id=session_id), timeout=10)

    def calls(self, session_id: str) -> list[common_pb2.CallRecord]:
        """The session's captured calls, in sequence order."""
        return list(self.get_session(session_id).calls)


def assert_chain_extends(calls: list[common_pb2.CallRecord]) -> None:
    """Each call's prompt starts with the previous call's prompt + sampled ids, token for token."""
    for previous, current in itertools.pairwise(calls):
        head = [*previous.prompt_token_ids, *previous.completion_token_ids]
        assert list(current.prompt_token_ids[: len(head)]) == head, (
            f"call {current.sequence} does not extend call {previous.sequence} token by token"
        )
        assert current.continued_from_sequence == previous.sequence
