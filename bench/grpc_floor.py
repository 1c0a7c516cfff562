"""The floor under lodestar's per-call `Generate`: the gRPC transport and the vLLM engine, nothing else.

A bare grpc.aio server (health for the start-up check, no interceptors, no log lines) whose `Generate`
renders the prompt with lodestar's chat template, runs lodestar's `VllmEngine` at the inference service's
pace (`generation.stream_interval`: the same flush interval and message budget, so the same number of
messages per stream), and sends each step it gets as a delta of ids and logprobs only (no detokenizing, no
reasoning or tool-call parsing, no stop sequences), then a final with the prompt ids, the ids, the
logprobs and the finish reason. That is all bench/raw_vllm.py counts, and what any gRPC front end over
vLLM in Python has to do at least.

Measured beside the real server and raw vLLM (`bench/inference.py --compare-raw --floor`), it splits the
gap of per-call `Generate` into the transport's share (floor / raw: a gRPC call and its messages, client
and server) and lodestar's own layers above the engine (lodestar / floor: the interceptor, `Generation`,
the log lines).

    .venv-vllm/bin/python bench/grpc_floor.py MODEL_DIR PORT KV_CACHE_BYTES
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
import grpc.aio  # noqa: E402
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # noqa: E402

from lodestar.v1 import common_pb2, inference_pb2  # noqa: E402
from lodestar_inference.engine import EngineRequest  # noqa: E402
from lodestar_inference.engines.vllm import VllmEngine  # noqa: E402
from lodestar_inference.generation import sampling_options, stream_interval  # noqa: E402
from lodestar_inference.settings import InferenceSettings  # noqa: E402
from lodestar_inference.templates import ChatTemplate  # noqa: E402
from lodestar_inference.tokenizer import TextTokenizer  # noqa: E402

_FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH}


class FloorServicer:
    """`Generate` as the module docstring says (the only method the floor serves)."""

    def __init__(self, engine: VllmEngine, template: ChatTemplate, settings: InferenceSettings) -> None:
        self._engine = engine
        self._template = template
        self._cap = settings.max_new_tokens
        self._flush_s = settings.stream_flush_ms / 1e3
        self._messages_per_s = settings.stream_messages_per_s
        self._streams = 0

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        info = self._engine.info()
        prompt = self._template.prompt(request.messages)
        options = sampling_options(request.sampling, self._cap, info.context_length - len(prompt.ids))
        hold = stream_interval(self._flush_s, self._messages_per_s, self._streams) if request.stream else 0.0
        engine_request = EngineRequest(
            f"floor-{id(request)}", prompt.ids, options, final_only=not request.stream, hold_s=hold
        )
        ids: list[int] = []
        logprobs: list[float] = []
        finish = "stop"
        self._streams += int(request.stream)
        try:
            async for step in self._engine.generate(engine_request):
                ids += step.token_ids
                logprobs += step.logprobs
                finish = step.finish_reason or finish
                if request.stream:
                    delta = inference_pb2.GenerateDelta(token_ids=step.token_ids, logprobs=step.logprobs)
                    yield inference_pb2.GenerateResponse(delta=delta)
        finally:
            self._streams -= int(request.stream)
        final = inference_pb2.GenerateFinal(
            prompt_token_ids=prompt.ids,
            completion_token_ids=ids,
            completion_logprobs=logprobs,
            finish_reason=_FINISH[finish],
        )
        yield inference_pb2.GenerateResponse(final=final)


async def serve(model_dir: Path, port: int, kv_cache_bytes: int) -> None:
    settings = InferenceSettings(backend="vllm", model=model_dir, kv_cache_bytes=kv_cache_bytes)
    engine = VllmEngine(settings)
    await engine.start()
    server = grpc.aio.server()
    servicer = FloorServicer(engine, ChatTemplate(TextTokenizer.load(model_dir)), settings)
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate,
            request_deserializer=inference_pb2.GenerateRequest.FromString,
            response_serializer=inference_pb2.GenerateResponse.SerializeToString,
        )
    }
    name = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)  # as the generated add_*_to_server does
    status = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await status.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(1.0)
    await engine.close()


@contextlib.contextmanager
def serve_floor(model_dir: Path, log_dir: Path, kv_cache_bytes: int) -> Iterator[tuple[str, int]]:
    """Run the floor server as a subprocess under .venv-vllm until the block ends: (address, pid)."""
    from bench.inference_servers import PYTHONS, START_TIMEOUT_S, run_server
    from lodestar_app.local import free_port

    port = free_port()
    command = [str(PYTHONS["vllm"]), str(Path(__file__).resolve()), str(model_dir), str(port), str(kv_cache_bytes)]
    with run_server("floor", command, port, log_dir / f"floor-{port}.log", START_TIMEOUT_S["vllm"]) as server:
        yield server.address, server.process.pid


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
