"""`lodestar dashboard --rollout HOST:PORT --runs-dir DIR`: the run dashboard in a browser (docs/dashboard.md).

Serves the read-only web UI (lodestar_app/dashboard) on 127.0.0.1:8090 by default (a free port when that one is
taken and no `--port` was given) until Ctrl-C / SIGTERM, and prints its address. Bound beyond loopback it
needs a token (`--token-file` or $LODESTAR_DASHBOARD_TOKEN; the browser opens `URL?token=...` once). It
reads rollout over gRPC with the same TLS/token flags as `lodestar run` and the trainer's metrics from
`<runs-dir>/<run id>/metrics.jsonl`; `--model DIR` decodes token ids with that model's tokenizer.
`lodestar up --dashboard` and `lodestar train --dashboard` serve the same on loopback (`start_local`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from lodestar.errors import InvalidArgumentError, LodestarError
from lodestar.logging import get_logger
from lodestar_app.cli import client_security
from lodestar_app.cli.run import DEFAULT_ROLLOUT

if TYPE_CHECKING:  # aiohttp is imported only when serving
    from lodestar_app.dashboard.server import Dashboard, DashboardSettings
    from lodestar_app.dashboard.shape import TokenTexts

DEFAULT_PORT = 8090
DEFAULT_RUNS_DIR = Path("runs/train")
"""`lodestar train`'s default run_dir: its runs are `<run_dir>/<run id>`."""
TOKEN_ENV = "LODESTAR_DASHBOARD_TOKEN"
_TOKEN_BYTES_MAX = 4096
_log = get_logger("cli.dashboard")


def token_texts(model_dir: Path) -> TokenTexts:
    """Each token id's text under the tokenizer of `model_dir` (cached per id)."""
    from lodestar_inference.tokenizer import TextTokenizer  # the tokenizers library only, no torch

    tokenizer = TextTokenizer.load(model_dir)
    cache: dict[int, str] = {}

    def texts(ids: Sequence[int]) -> list[str]:
        out = []
        for token in ids:
            text = cache.get(token)
            if text is None:
                text = cache[token] = tokenizer.decode([token], skip_special_tokens=False)
            out.append(text)
        return out

    return texts


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    path: Path = args.token_file
    try:
        data = path.read_bytes()[:_TOKEN_BYTES_MAX]
    except OSError as error:
        raise InvalidArgumentError(f"cannot read --token-file {args.token_file}: {error.strerror}") from None
    token = data.decode(errors="replace").strip()
    if not token:
        raise InvalidArgumentError(f"--token-file {args.token_file} is empty")
    return token


def _server() -> ModuleType:
    """lodestar_app.dashboard.server, or a clear error when aiohttp is missing."""
    try:
        from lodestar_app.dashboard import server
    except ImportError as error:
        raise InvalidArgumentError(
            f"the dashboard needs aiohttp ({error}): pip install 'lodestar[dashboard]'"
        ) from None
    return server


def settings_for(
    rollout: str,
    runs_dir: Path | None,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    model: Path | None = None,
    advantage: str = "zscore",
) -> DashboardSettings:
    """The dashboard's settings."""
    from lodestar_trainer.step.advantages import AdvantageKind

    texts = token_texts(model) if model is not None else None
    settings: DashboardSettings = _server().DashboardSettings(
        rollout=rollout,
        host=host,
        port=port,
        runs_dir=runs_dir,
        token=token,
        token_texts=texts,
        advantage=AdvantageKind(advantage),
    )
    return settings


async def start_local(rollout: str, runs_dir: Path | None, model: Path | None = None) -> Dashboard:
    """A loopback dashboard for `lodestar up` / `lodestar train --dashboard` (port 8090 or a free one)."""
    from lodestar_app.local import port_or_free

    try:
        settings = settings_for(rollout, runs_dir, port=port_or_free(DEFAULT_PORT), model=model)
    except LodestarError as error:  # a model without a usable tokenizer: show token ids
        _log.warning("dashboard shows token ids only", model=str(model), reason=error.message)
        settings = settings_for(rollout, runs_dir, port=port_or_free(DEFAULT_PORT))
    dashboard: Dashboard = await _server().start(settings)
    return dashboard


async def _serve(args: argparse.Namespace) -> int:
    from lodestar_app.local import port_or_free

    port = args.port if args.port is not None else port_or_free(DEFAULT_PORT)
    settings = settings_for(
        args.rollout,
        args.runs_dir.resolve(),
        host=args.host,
        port=port,
        token=_token(args),
        model=args.model,
        advantage=args.advantage,
    )
    dashboard: Dashboard = await _server().start(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"dashboard: {dashboard.url}  (rollout {args.rollout}, runs {settings.runs_dir}); Ctrl-C stops it")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(dashboard.close(), timeout=10.0)
    return 0


def _handle(args: argparse.Namespace) -> int:
    return asyncio.run(_serve(args))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `dashboard` command."""
    command = subparsers.add_parser("dashboard", help="the run dashboard in a browser (runs, curves, sessions, calls)")
    command.add_argument("--rollout", default=DEFAULT_ROLLOUT, metavar="HOST:PORT", help="RolloutService address")
    command.add_argument(
        "--runs-dir", type=Path, default=DEFAULT_RUNS_DIR, help=f"the trainer's run_dir ({DEFAULT_RUNS_DIR})"
    )
    command.add_argument("--host", default="127.0.0.1", help="bind address (beyond loopback needs a token)")
    command.add_argument("--port", type=int, default=None, help=f"HTTP port (default {DEFAULT_PORT} or a free one)")
    command.add_argument("--token-file", type=Path, default=None, help=f"the browser's token (or ${TOKEN_ENV})")
    command.add_argument("--model", type=Path, default=None, metavar="DIR", help="decode tokens with this tokenizer")
    command.add_argument(
        "--advantage", choices=["zscore", "mean", "leave_one_out"], default="zscore", help="advantage shown"
    )
    client_security.add_arguments(command)
    command.set_defaults(handler=client_security.secured(_handle))
