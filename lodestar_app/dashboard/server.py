"""The dashboard's HTTP server (aiohttp): JSON endpoints under /api, the page routes (one static page whose
plain JS fetches the JSON and draws with the vendored uPlot), token auth and error mapping.

Routes translate HTTP to `RolloutReader` / metrics reads and `shape` functions, nothing more. Page routes
check that the run, session or call exists first, so an unknown id answers a 404 page; JSON routes answer
404 with `{"error": ...}`; an unexpected failure answers 500 with no internals (logged here instead).
Bound beyond loopback the server refuses to start without a token; with a token every route but /healthz
needs it (`Authorization: Bearer`, or `?token=` once: it is then kept in an HttpOnly cookie).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from lodestar import errors
from lodestar.grpc.security import is_loopback
from lodestar.logging import get_logger
from lodestar_app.dashboard import shape
from lodestar_app.dashboard.source import RolloutReader, read_metrics
from lodestar_trainer.step.advantages import AdvantageKind

STATIC_DIR = Path(__file__).parent / "static"
DEFAULT_PAGE = 50
MAX_PAGE = 200
"""Calls per page of a session (a session may have hundreds of calls of 100 KB each)."""
FAILED_ATTEMPTS_SHOWN = 2000
COOKIE = "lodestar_dashboard"
_STATUS = {
    errors.InvalidArgumentError: 400,
    errors.NotFoundError: 404,
    errors.UnauthenticatedError: 401,
    errors.PermissionDeniedError: 403,
    errors.UnavailableError: 503,
    errors.DeadlineExceededError: 504,
}
_log = get_logger("dashboard")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class DashboardSettings:
    rollout: str
    """RolloutService address (host:port); TLS and token from the process's client security."""
    host: str = "127.0.0.1"
    port: int = 8090
    runs_dir: Path | None = None
    """Where the trainer's run directories are (`<runs_dir>/<run id>/metrics.jsonl`)."""
    token: str | None = None
    """Required from every browser when set; mandatory when `host` is not loopback."""
    token_texts: shape.TokenTexts | None = None
    """Each token id's text (the served model's tokenizer); None: tokens are shown as ids."""
    advantage: AdvantageKind = AdvantageKind.ZSCORE


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve run data beyond loopback without a token."""
    if not is_loopback(host) and not token:
        raise errors.InvalidArgumentError(
            f"refusing to serve the dashboard on {host or 'every interface'} without a token: give "
            "--token-file (or $LODESTAR_DASHBOARD_TOKEN), or bind 127.0.0.1"
        )


def _status(error: errors.LodestarError) -> int:
    return next((code for kind, code in _STATUS.items() if isinstance(error, kind)), 500)


def _error_page(status: int, message: str) -> web.Response:
    body = (
        "<!doctype html><html><head><meta charset='utf-8'><title>lodestar dashboard: error</title>"
        "<link rel='stylesheet' href='/static/app.css'></head><body><main>"
        f"<h1>{status}</h1><p class='error'>{_escape(message)}</p><p><a href='/'>all runs</a></p></main></body></html>"
    )
    return web.Response(status=status, text=body, content_type="text/html")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _reply_error(request: web.Request, status: int, message: str) -> web.Response:
    if request.path.startswith("/api/"):
        return web.json_response({"error": message}, status=status)
    return _error_page(status, message)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.LodestarError as error:
        return _reply_error(request, _status(error), error.message)
    except web.HTTPException as error:
        if error.status >= 400:
            return _reply_error(request, error.status, error.reason)
        raise
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception:
        _log.exception("dashboard request failed", path=request.path)
        return _reply_error(request, 500, "internal error (see the dashboard's log)")


def _auth(token: str) -> Any:
    expected = token.encode()

    def matches(given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), expected)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ").strip() or None
        query = request.query.get("token")
        if not (matches(bearer) or matches(request.cookies.get(COOKIE)) or matches(query)):
            return _reply_error(request, 401, "this dashboard needs its token: open it with ?token=...")
        response = await handler(request)
        if matches(query):
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
        return response

    return check


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgumentError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise errors.InvalidArgumentError(f"{name} must be within {low}..{high}, got {value}")
    return value


class Routes:
    """The dashboard's handlers over one `RolloutReader`."""

    def __init__(self, settings: DashboardSettings, reader: RolloutReader) -> None:
        self.settings = settings
        self.reader = reader

    def _metrics(self, run_id: str) -> list[dict[str, float]]:
        return read_metrics(self.settings.runs_dir, run_id)

    async def page(self, request: web.Request) -> web.StreamResponse:
        """The single page; the ids in its path must exist (else a 404 page)."""
        info = request.match_info
        if "sequence" in info:
            await self.reader.call(info["session_id"], int(info["sequence"]))
        elif "session_id" in info:
            await self.reader.session(info["session_id"], 0, 1, bodies=False)
        elif "run_id" in info:
            await self.reader.get_run(info["run_id"])
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def runs(self, request: web.Request) -> web.StreamResponse:
        runs = await self.reader.list_runs(_int(request, "limit", 0, 0, 10_000))
        return web.json_response({"runs": [shape.run_row(run, self._metrics(run.run_id)) for run in runs]})

    async def run(self, request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        run = await self.reader.get_run(run_id)
        groups = await self.reader.list_groups(run_id)
        failed = await self.reader.failed_attempts(run_id, FAILED_ATTEMPTS_SHOWN)
        return web.json_response(
            {
                "run": shape.run_row(run, self._metrics(run_id)),
                "advantage": str(self.settings.advantage),
                "groups": shape.group_rows(groups, self.settings.advantage),
                "failures": shape.failure_causes(failed),
                "failed_attempts": len(failed),
            }
        )

    async def curves(self, request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        await self.reader.get_run(run_id)  # 404 for an unknown run, also when no metrics exist
        return web.json_response(shape.curves(self._metrics(run_id)))

    async def session(self, request: web.Request) -> web.StreamResponse:
        offset = _int(request, "offset", 0, 0, 1_000_000)
        limit = _int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        detail = await self.reader.session(request.match_info["session_id"], offset, limit, bodies=False)
        return web.json_response(shape.session_view(detail, offset, limit))

    async def call(self, request: web.Request) -> web.StreamResponse:
        detail, call = await self.reader.call(request.match_info["session_id"], int(request.match_info["sequence"]))
        texts = self.settings.token_texts
        view = await asyncio.to_thread(shape.call_view, call, detail.call_count, texts)
        return web.json_response(view)

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True})


def build_app(settings: DashboardSettings, reader: RolloutReader) -> web.Application:
    middlewares = [_errors] + ([_auth(settings.token)] if settings.token else [])
    app = web.Application(middlewares=middlewares)
    routes = Routes(settings, reader)
    app.router.add_get("/", routes.page)
    app.router.add_get("/runs/{run_id}", routes.page)
    app.router.add_get("/sessions/{session_id}", routes.page)
    app.router.add_get(r"/sessions/{session_id}/calls/{sequence:\d{1,9}}", routes.page)
    app.router.add_get("/api/runs", routes.runs)
    app.router.add_get("/api/runs/{run_id}", routes.run)
    app.router.add_get("/api/runs/{run_id}/curves", routes.curves)
    app.router.add_get("/api/sessions/{session_id}", routes.session)
    app.router.add_get(r"/api/sessions/{session_id}/calls/{sequence:\d{1,9}}", routes.call)
    app.router.add_get("/healthz", routes.health)
    app.router.add_static("/static", STATIC_DIR, follow_symlinks=False)
    return app


class Dashboard:
    """A started dashboard: `url`, and `close()` to stop it."""

    def __init__(self, runner: web.AppRunner, reader: RolloutReader, url: str) -> None:
        self._runner = runner
        self._reader = reader
        self.url = url

    async def close(self) -> None:
        await self._runner.cleanup()
        await self._reader.close()


async def start(settings: DashboardSettings) -> Dashboard:
    """Serve the dashboard on the current event loop (port 0: any free port); its URL is `Dashboard.url`."""
    check_bind(settings.host, settings.token)
    reader = RolloutReader(settings.rollout)
    runner = web.AppRunner(build_app(settings, reader), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        await reader.close()
        raise errors.UnavailableError(
            f"cannot serve the dashboard on {settings.host}:{settings.port}: {error}"
        ) from None
    port = int(runner.addresses[0][1]) if runner.addresses else settings.port
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host or '0.0.0.0'}:{port}/"
    _log.info("dashboard serving", url=url, rollout=settings.rollout, runs_dir=str(settings.runs_dir))
    return Dashboard(runner, reader, url)
