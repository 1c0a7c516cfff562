"""structlog set-up: JSON lines off a terminal, readable console lines on one.

`configure_logging` is called once by each `main()`. Request-scoped ids (session, run, policy version)
are bound with `structlog.contextvars.bind_contextvars` and appear on every line logged in that context.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger (grpc, aiohttp) to write to stderr."""
    use_json = (not sys.stderr.isatty()) if json is None else json
    numeric_level = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=_StderrLogger.factory,
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric_level, logging.WARNING), stream=sys.stderr, force=True)


class _StderrLogger:
    """Writes each line to whatever `sys.stderr` is at that moment (structlog's PrintLogger keeps the stream it
    was made with: a CLI command run in-process by a test would keep pytest's capture file after it closed)."""

    @classmethod
    def factory(cls, *args: object) -> _StderrLogger:
        del args
        return cls()

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = failure = msg


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A logger bound to a component name."""
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(component=name)
    return logger
