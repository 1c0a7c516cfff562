"""The gRPC adapter from the gateway to InferenceService (the only gateway module that calls inference).

Failed RPCs become domain errors (`lodestar.grpc.errors.error_from_rpc`): INVALID_ARGUMENT (e.g. a prompt
over the context length) reaches the harness as a 400, UNAVAILABLE as a retryable 503/529, INTERNAL/UNKNOWN
(a bug) as a 500 that nobody retries. Cancelling the
consuming task (a client that went away) cancels the RPC, which stops generation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import grpc.aio

from lodestar.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    LodestarError,
    ResourceExhaustedError,
    UnavailableError,
)
from lodestar.grpc.client import connect
from lodestar.grpc.errors import TRANSIENT_CODES, error_from_rpc
from lodestar.v1 import inference_pb2, inference_pb2_grpc


class GrpcInference:
    """InferenceBackend over a gRPC channel."""

    def __init__(self, target: str, *, timeout_s: float = 600.0) -> None:
        self.target = target
        self._timeout = timeout_s
        self._channel = connect(target, default_timeout=30.0)
        self._stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._info: inference_pb2.GetModelInfoResponse | None = None

    async def close(self) -> None:
        await self._channel.close()

    async def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        call = self._stub.Generate(request, timeout=self._timeout)
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as error:
            raise _domain_error(error) from None
        finally:
            call.cancel()

    async def count_tokens(self, request: inference_pb2.CountTokensRequest) -> int:
        try:
            response = await self._stub.CountTokens(request)
        except grpc.aio.AioRpcError as error:
            raise _domain_error(error) from None
        return response.prompt_tokens

    async def model_info(self) -> inference_pb2.GetModelInfoResponse:
        """The served model (cached after the first success)."""
        if self._info is None:
            try:
                self._info = await self._stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=5.0)
            except grpc.aio.AioRpcError as error:
                raise UnavailableError(f"inference at {self.target} is unavailable: {error.code().name}") from None
        return self._info


def _domain_error(error: grpc.aio.AioRpcError) -> LodestarError:
    """What a harness may see of a failed inference call (docs/gateway.md, "Error classes"):
    the caller's fault (INVALID_ARGUMENT, incl. a context overflow) with inference's message; the transient
    codes (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED) as themselves and UNAVAILABLE as a generic retryable error
    (the channel's details name internal addresses); everything else is a bug or a misconfiguration on our
    side: InternalError (500, not transient, never retried by the gRPC channel)."""
    domain = error_from_rpc(error)
    if isinstance(domain, InvalidArgumentError | ResourceExhaustedError | DeadlineExceededError):
        return domain
    if error.code() in TRANSIENT_CODES or isinstance(domain, UnavailableError):
        return UnavailableError("the model backend is unavailable; retry shortly")
    return InternalError("the model backend failed on this request (an internal error; see the inference log)")
