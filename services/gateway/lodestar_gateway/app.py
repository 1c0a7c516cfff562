"""The vendor-API HTTP surface (aiohttp): routes, authentication, body limits, streaming, error shapes.

Thin transport: each route reads the body, authenticates the session key, lets its dialect parse, and
hands the canonical request to `Proxy`; responses are the dialect's JSON or its event stream, written
delta by delta as inference produces them. Every failure is answered in the caller's dialect's error
shape; nothing escapes as an HTML page or a bare 500.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from lodestar.errors import InvalidArgumentError, LodestarError, NotFoundError
from lodestar.logging import get_logger
from lodestar.v1 import inference_pb2
from lodestar_gateway import dialects, sse
from lodestar_gateway.canonical import CallResult, CanonicalRequest, new_id, now_seconds
from lodestar_gateway.dialects.base import DialectAdapter, Route, StreamRenderer
from lodestar_gateway.errors import (
    InternalError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
)
from lodestar_gateway.models import anthropic_count, google_count, google_models, openai_models
from lodestar_gateway.proxy import Proxy
from lodestar_gateway.quotas import QuotaLimits, SessionQuotas
from lodestar_gateway.sessions import SessionEntry, SessionRegistry

_log = get_logger("gateway.http")
ANTHROPIC = dialects.AnthropicMessages()
CHAT = dialects.OpenAIChat()
RESPONSES = dialects.OpenAIResponses()
GOOGLE = dialects.GoogleGenerateContent()
_RESPONSE_PREFIX = {ANTHROPIC.name: "msg_", CHAT.name: "chatcmpl-", RESPONSES.name: "resp_", GOOGLE.name: "gen-"}
_JSON_TYPES = ("application/json", "text/plain", "application/octet-stream", "")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_key(request: web.Request) -> str | None:
    """The session key from x-api-key, x-goog-api-key, Authorization: Bearer, or ?key=."""
    headers = request.headers
    key = headers.get("x-api-key") or headers.get("x-goog-api-key")
    if not key:
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        key = token.strip() if scheme.lower() == "bearer" else None
    return key or request.query.get("key")


def dialect_for_path(path: str) -> DialectAdapter:
    if path.startswith("/v1/messages"):
        return ANTHROPIC
    if path.startswith("/v1beta/") or ":" in path.rpartition("/")[2]:
        return GOOGLE
    if path.startswith("/v1/responses"):
        return RESPONSES
    return CHAT


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=sse.dump_bytes(body), status=status, content_type="application/json")


def error_response(dialect: DialectAdapter, error: LodestarError) -> web.Response:
    status, body = dialect.error(error)
    return json_response(body, status)


class GatewayHttp:
    """Builds the aiohttp application of one gateway node."""

    def __init__(
        self, proxy: Proxy, sessions: SessionRegistry, *, max_body_bytes: int, quotas: QuotaLimits | None = None
    ) -> None:
        self._proxy = proxy
        self._sessions = sessions
        self._max_body = max_body_bytes
        self._quotas = SessionQuotas(quotas or QuotaLimits())

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self._max_body, middlewares=[self._errors])
        post = app.router.add_post
        post("/v1/messages", self._anthropic)
        post("/v1/messages/count_tokens", self._anthropic_count)
        post("/v1/chat/completions", self._chat)
        post("/v1/responses", self._responses)
        for version in ("v1beta", "v1"):
            post(f"/{version}/models/{{tail:.+}}", self._google)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model:.+}", self._model)
        app.router.add_get("/v1beta/models", self._models)
        app.router.add_get("/v1beta/models/{model:.+}", self._model)
        app.router.add_route("HEAD", "/", self._root)
        app.router.add_get("/", self._root, allow_head=False)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        dialect = dialect_for_path(request.path)
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed:
            return error_response(dialect, MethodNotAllowedError(f"{request.method} is not allowed on {request.path}"))
        except web.HTTPNotFound:
            if request.method == "HEAD":
                return web.Response(status=404)
            return error_response(dialect, NotFoundError(f"no such endpoint: {request.method} {request.path}"))
        except web.HTTPException as error:
            if error.status < 400:
                raise
            return error_response(dialect, InvalidArgumentError(error.reason))
        except LodestarError as error:
            return error_response(dialect, error)
        except Exception:
            _log.exception("unhandled error", path=request.path)
            return error_response(dialect, InternalError("internal error in the gateway (see its log)"))

    async def _root(self, request: web.Request) -> web.Response:
        return json_response({"service": "lodestar gateway"}) if request.method != "HEAD" else web.Response()

    # Model calls -------------------------------------------------------------------------------------

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ANTHROPIC, Route())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, CHAT, Route())

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, RESPONSES, Route())

    async def _google(self, request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["tail"].rpartition(":")
        if method == "countTokens":
            return await self._count(request, GOOGLE, Route(model=model), google_count)
        if method not in ("generateContent", "streamGenerateContent") or not model:
            return error_response(GOOGLE, NotFoundError(f"no such method: {request.match_info['tail']!r}"))
        stream = method == "streamGenerateContent"
        route = Route(model=model, stream=stream, sse=request.query.get("alt") == "sse")
        return await self._generate(request, GOOGLE, route)

    async def _anthropic_count(self, request: web.Request) -> web.StreamResponse:
        return await self._count(request, ANTHROPIC, Route(), anthropic_count)

    async def _parse(
        self, request: web.Request, dialect: DialectAdapter, route: Route, *, count_tokens: bool = False
    ) -> tuple[SessionEntry, CanonicalRequest, bytes]:
        session = self._sessions.authenticate(api_key(request))
        body = await self._read_body(request)
        try:
            decoded = sse.loads(body)
        except (ValueError, RecursionError) as error:
            raise InvalidArgumentError(f"body: malformed JSON ({_json_problem(error)})") from None
        try:
            parsed = dialect.parse(decoded, route, count_tokens=count_tokens)
            self._proxy.unknown_fields.check(dialect.dialect, parsed.unknown_fields)
        except RecursionError:
            raise InvalidArgumentError("body: nested too deeply") from None
        except UnicodeError:
            raise InvalidArgumentError("body: a string contains an unpaired UTF-16 surrogate") from None
        return session, parsed, body

    async def _read_body(self, request: web.Request) -> bytes:
        if request.content_type.lower() not in _JSON_TYPES and not request.content_type.endswith("+json"):
            raise UnsupportedMediaTypeError(f"unsupported content type {request.content_type!r}: send application/json")
        if request.content_length is not None and request.content_length > self._max_body:
            raise PayloadTooLargeError(f"request body of {request.content_length} bytes exceeds {self._max_body}")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise PayloadTooLargeError(f"request body exceeds {self._max_body} bytes") from None

    async def _count(
        self, request: web.Request, dialect: DialectAdapter, route: Route, render: Callable[[int], Any]
    ) -> web.StreamResponse:
        """A token count: admitted by the session's quotas like a model call (it reaches inference too)."""
        try:
            session, parsed, body = await self._parse(request, dialect, route, count_tokens=True)
            with self._quotas.admit(session, len(body)):
                return json_response(render(await self._proxy.count_tokens(parsed)))
        except LodestarError as error:
            return error_response(dialect, error)

    async def _generate(self, request: web.Request, dialect: DialectAdapter, route: Route) -> web.StreamResponse:
        started = time.perf_counter()
        log = _log.bind(dialect=dialect.name, path=request.path)
        try:
            session, parsed, body = await self._parse(request, dialect, route)
        except LodestarError as error:
            failed = error_response(dialect, error)
            log.info("call", status=failed.status, error=error.message, duration_ms=_ms(started))
            return failed
        log = log.bind(session_id=session.session_id, stream=parsed.stream, parse_ms=_ms(started))
        try:
            admitted = self._quotas.admit(session, len(body))
        except LodestarError as error:
            refused = error_response(dialect, error)
            log.warning("call refused", status=refused.status, error=error.message, duration_ms=_ms(started))
            return refused
        response_id = new_id(_RESPONSE_PREFIX[dialect.name])
        events = self._proxy.call(session, parsed, body, response_id=response_id)
        response: web.StreamResponse
        failure: _Failure | None = None
        with admitted:
            async with contextlib.aclosing(events):
                if parsed.stream:
                    response, result, failure = await self._stream(request, dialect, parsed, events, response_id)
                else:
                    response, result = await self._collect(dialect, parsed, events)
        if failure is not None:  # one line: the harness got a 200 whose stream ends in the dialect's error event
            log.warning(
                "call failed mid-stream",
                status=response.status,
                response_id=response_id,
                error=failure.error,
                error_kind=failure.kind,
                events_sent=failure.events_sent,
                duration_ms=_ms(started),
            )
            return response
        details = (
            {"sequence": result.sequence, **{k: round(v, 3) for k, v in result.timings_ms.items()}} if result else {}
        )
        log.info("call", status=response.status, duration_ms=_ms(started), **details)
        return response

    async def _collect(
        self, dialect: DialectAdapter, parsed: CanonicalRequest, events: AsyncIterator[Any]
    ) -> tuple[web.StreamResponse, CallResult | None]:
        try:
            async for event in events:
                if isinstance(event, CallResult):
                    return json_response(dialect.render(parsed, event)), event
        except LodestarError as error:
            return error_response(dialect, error), None
        return error_response(dialect, InvalidArgumentError("no result")), None

    async def _stream(
        self,
        request: web.Request,
        dialect: DialectAdapter,
        parsed: CanonicalRequest,
        events: AsyncIterator[Any],
        response_id: str,
    ) -> tuple[web.StreamResponse, CallResult | None, _Failure | None]:
        """Stream the call. A failure after the response started (headers sent, status 200) ends the stream
        with the dialect's in-stream error event (never a normal terminator, so no SDK or harness mistakes
        the partial answer for a complete one); the unanswered call leaves no CallRecord (see `Proxy`)."""
        renderer = dialect.stream(parsed)
        iterator = aiter(events)
        try:
            first = await anext(iterator)  # errors before the first token still get a proper status
        except LodestarError as error:
            return error_response(dialect, error), None, None
        response = web.StreamResponse(headers={"Content-Type": renderer.content_type, "Cache-Control": "no-cache"})
        await response.prepare(request)
        result: CallResult | None = None
        failure: LodestarError | None = None
        sent = 0
        try:
            chunk = renderer.start(response_id, now_seconds()) + _render(renderer, first)
            result = first if isinstance(first, CallResult) else None
            await response.write(chunk)
            sent += 1
            async for event in iterator:
                if isinstance(event, CallResult):
                    result = event
                if chunk := _render(renderer, event):
                    await response.write(chunk)
                    sent += 1
        except LodestarError as error:
            failure = error
        except ConnectionResetError:
            return response, None, None  # the client went away; closing `events` cancels the generation
        except Exception:
            _log.exception("unhandled error while streaming", path=request.path)
            failure = InternalError("internal error in the gateway (see its log)")
        with contextlib.suppress(ConnectionResetError):  # a client gone at this point needs no terminator
            if failure is not None:
                await response.write(renderer.error(failure))
            await response.write_eof()
        if failure is None:
            return response, result, None
        return response, None, _Failure(failure.message, type(failure).__name__, sent)

    # Models --------------------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        info = await self._proxy.model_info()
        google = request.path.startswith("/v1beta/")
        return json_response(google_models(info) if google else openai_models(info))

    async def _model(self, request: web.Request) -> web.Response:
        info = await self._proxy.model_info()
        model = request.match_info["model"]
        if request.path.startswith("/v1beta/"):
            return json_response(google_models(info, model)["models"][0])
        return json_response(openai_models(info, model)["data"][0])


@dataclass(frozen=True)
class _Failure:
    """A stream that failed after its response had started."""

    error: str
    kind: str
    events_sent: int
    """Writes (groups of dialect events) that reached the client before the failure."""


def _render(renderer: StreamRenderer, event: inference_pb2.GenerateDelta | CallResult) -> bytes:
    return renderer.finish(event) if isinstance(event, CallResult) else renderer.delta(event)


def _json_problem(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply"
    if isinstance(error, sse.JSONDecodeError):
        return f"{error.msg} at line {error.lineno} column {error.colno}"
    return "not UTF-8 JSON text"


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1e3, 3)
