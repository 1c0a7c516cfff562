"""The gRPC adapter from the gateway to InferenceService (the only gateway module that calls inference).

Generations go over one `GenerateMany` stream per channel (`GenerateStreams`): a generation is a tag on
it, not a call of its own, and the server sends the deltas of all the streams that are ready in one
message, so the gateway and inference pay gRPC's per-call and per-message costs once per batch rather
than once per generation and per delta. A server without GenerateMany (UNIMPLEMENTED: an older build)
gets one `Generate` call per generation, as before.

Failures become domain errors (`lodestar.grpc.errors.error_from_status`): INVALID_ARGUMENT (e.g. a prompt
over the context length) reaches the harness as a 400, UNAVAILABLE as a retryable 503/529, INTERNAL/UNKNOWN
(a bug) as a 500 that nobody retries. UNAVAILABLE before the first response (a server starting or
draining, a broken stream) is retried like the channel's retry policy does for plain calls: 5 attempts,
backoff from 0.1 s doubling; so is a generation whose stream ended before it delivered anything, whatever
the code (that is the transport's failure, not the generation's). A stream that breaks with INTERNAL or
UNKNOWN (a server SIGKILLed under an open stream can end it with INTERNAL "Internal error from Core") fails
the generations on it that had received nothing as UNAVAILABLE: retried on a new stream, then failed over
by a ReplicaSet, never a 500 for a call the server never answered. Every generation has a deadline
(`timeout_s`). Cancelling the consuming task (a client that went away) cancels the generation, which stops
it and frees its slot.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Final, NamedTuple

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
from lodestar.grpc.errors import STATUS_BY_NUMBER, TRANSIENT_CODES, error_from_rpc, error_from_status
from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2, inference_pb2_grpc

_log = get_logger("gateway.inference")
RETRY_BACKOFF_S: Final = (0.1, 0.2, 0.4, 0.8)
"""Waits before the 2nd..5th attempt of a generation refused UNAVAILABLE (as `connect()`'s retry policy)."""
BROKEN_STREAM_CODES: Final = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
"""Codes a whole GenerateMany stream can end with when its transport breaks (the server died)."""


class GrpcInference:
    """InferenceBackend over a gRPC channel."""

    def __init__(self, target: str, *, timeout_s: float = 600.0, multiplex: bool = True) -> None:
        """`multiplex=False`: one Generate call per generation (the per-call path, e.g. for comparisons)."""
        self.target = target
        self._timeout = timeout_s
        self._channel = connect(target, default_timeout=30.0)
        self._stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._streams = GenerateStreams(self._stub) if multiplex else None
        self._info: inference_pb2.GetModelInfoResponse | None = None

    async def close(self) -> None:
        if self._streams is not None:
            self._streams.close()
        await self._channel.close()

    async def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        if self._streams is not None:
            try:
                async for response in self._streams.generate(request, self._timeout):
                    yield response
                return
            except NotServedError:
                _log.warning(
                    "inference has no GenerateMany (an older server): one Generate call per generation",
                    target=self.target,
                )
                self._streams.close()
                self._streams = None
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
    return _caller_error(error.code(), error_from_rpc(error))


def _caller_error(code: grpc.StatusCode, domain: LodestarError) -> LodestarError:
    """What a harness may see of a failed inference call (docs/gateway.md, "Error classes"):
    the caller's fault (INVALID_ARGUMENT, incl. a context overflow) with inference's message; the transient
    codes (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED) as themselves and UNAVAILABLE as a generic retryable error
    (the channel's details name internal addresses); everything else is a bug or a misconfiguration on our
    side: InternalError (500, not transient, never retried by the gRPC channel)."""
    if isinstance(domain, InvalidArgumentError | ResourceExhaustedError | DeadlineExceededError):
        return domain
    if code in TRANSIENT_CODES or isinstance(domain, UnavailableError):
        return UnavailableError("the model backend is unavailable; retry shortly")
    return InternalError("the model backend failed on this request (an internal error; see the inference log)")


class NotServedError(Exception):
    """The server has no GenerateMany (UNIMPLEMENTED before any response): use Generate instead."""


class _Failure(NamedTuple):
    """How a tag ended without a final response: the tag's own error, or its stream's."""

    code: grpc.StatusCode
    details: str
    metadata: Mapping[str, str]


_EXPIRED: Final = _Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "", {})
_Item = inference_pb2.TaggedGenerateResponse | _Failure


class _Stream:
    """One GenerateMany call: requests are queued to it, and a reader task routes its batches to the
    inboxes of the tags; when the call ends, every open tag gets the call's failure."""

    def __init__(self, stub: inference_pb2_grpc.InferenceServiceAsyncStub) -> None:
        self._requests: asyncio.Queue[inference_pb2.GenerateManyRequest | None] = asyncio.Queue()
        self.inboxes: dict[int, asyncio.Queue[_Item]] = {}
        self.failure: _Failure | None = None
        self.delivered = False
        """Whether a batch arrived: a stream that fails before one never started (its failure is the
        transport's, not a tag's: an old server's UNIMPLEMENTED can come back as another code when it ends
        the call while the first request is still being written)."""
        self._call = stub.GenerateMany(self._outgoing())  # no deadline: each tag carries its own
        self._reader = asyncio.create_task(self._read(), name="generate-many-reader")

    def send(self, request: inference_pb2.GenerateManyRequest) -> None:
        self._requests.put_nowait(request)

    def close(self) -> None:
        self._requests.put_nowait(None)
        self._call.cancel()

    async def _outgoing(self) -> AsyncIterator[inference_pb2.GenerateManyRequest]:
        while (request := await self._requests.get()) is not None:
            yield request

    async def _read(self) -> None:
        failure = _Failure(grpc.StatusCode.UNAVAILABLE, "the inference stream ended", {})
        try:
            async for batch in self._call:
                self.delivered = True
                for response in batch.responses:
                    inbox = self.inboxes.get(response.tag)
                    if inbox is not None:  # else: a tag its consumer has left (cancelled, timed out)
                        inbox.put_nowait(response)
        except grpc.aio.AioRpcError as error:
            metadata = {key: str(value) for key, value in error.trailing_metadata() or ()}
            failure = _Failure(error.code(), error.details() or error.code().name, metadata)
        except asyncio.CancelledError:
            failure = _Failure(grpc.StatusCode.UNAVAILABLE, "the inference stream was closed", {})
        finally:
            self.failure = failure
            for inbox in self.inboxes.values():
                inbox.put_nowait(failure)


class GenerateStreams:
    """Generations as tags of one GenerateMany stream, reopened when it breaks (see the module docstring)."""

    def __init__(self, stub: inference_pb2_grpc.InferenceServiceAsyncStub) -> None:
        self._stub = stub
        self._stream: _Stream | None = None
        self._tags = itertools.count(1)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _open(self) -> _Stream:
        if self._stream is None or self._stream.failure is not None:
            self.close()
            self._stream = _Stream(self._stub)
        return self._stream

    async def generate(
        self, request: inference_pb2.GenerateRequest, timeout_s: float
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """The responses of one generation (deltas, then the final one); raises its failure as a domain
        error, `NotServedError` when the server has no GenerateMany."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for backoff in (*RETRY_BACKOFF_S, None):
            stream, tag, received = self._open(), next(self._tags), False
            inbox: asyncio.Queue[_Item] = asyncio.Queue()
            stream.inboxes[tag] = inbox
            remaining = max(deadline - loop.time(), 1e-3)
            stream.send(inference_pb2.GenerateManyRequest(tag=tag, generate=request, timeout_s=remaining))
            expiry = loop.call_at(deadline, inbox.put_nowait, _EXPIRED)
            ended = False
            try:
                while True:
                    item = await inbox.get()
                    if isinstance(item, _Failure):
                        failure = item
                        break
                    if item.HasField("error"):
                        code = STATUS_BY_NUMBER.get(item.error.code, grpc.StatusCode.UNKNOWN)
                        failure = _Failure(code, item.error.message, dict(item.error.details))
                        break
                    received = True
                    if item.response.HasField("final"):
                        ended = True
                        yield item.response
                        return
                    yield item.response
                ended = failure is not _EXPIRED
            finally:
                expiry.cancel()
                del stream.inboxes[tag]
                if not ended and stream.failure is None:  # the consumer left, or the deadline passed
                    stream.send(inference_pb2.GenerateManyRequest(tag=tag, cancel=True))
            if failure is _EXPIRED:
                raise DeadlineExceededError(f"the model did not finish within {timeout_s:g} s")
            if not received and failure.code == grpc.StatusCode.UNIMPLEMENTED:
                raise NotServedError(failure.details)
            unstarted = failure is stream.failure and not stream.delivered and failure.code != grpc.StatusCode.OK
            if failure is stream.failure and not received and failure.code in BROKEN_STREAM_CODES:
                failure = _Failure(grpc.StatusCode.UNAVAILABLE, failure.details, failure.metadata)  # see the module
            retry = not received and (failure.code == grpc.StatusCode.UNAVAILABLE or unstarted)
            if retry and backoff is not None and loop.time() + backoff < deadline:
                await asyncio.sleep(backoff)
                continue
            raise _caller_error(failure.code, error_from_status(failure.code, failure.details, failure.metadata))
        raise AssertionError("unreachable: the last attempt raises")
