"""`lodestar {inference,gateway,rollout,trainer} serve`: start one service in the foreground.

Each service package provides `settings.py` (its `ServiceSettings` subclass, named in `SETTINGS`) and
`server.py` with `async def serve(settings)`. Flags are generated from the settings fields.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from functools import partial
from typing import Any

from lodestar.cli.flags import add_settings_arguments, flags_from_args
from lodestar.grpc import security
from lodestar.logging import configure_logging
from lodestar.settings import ServiceSettings, load_settings

SERVICES: dict[str, str] = {
    "inference": "token-faithful generation with logprob capture",
    "gateway": "vendor-API proxy and session capture",
    "rollout": "session scheduler and durable store",
    "trainer": "GRPO trainer",
}


def settings_class(service: str) -> type[ServiceSettings]:
    module = importlib.import_module(f"services.{service}.settings")
    klass: type[ServiceSettings] = module.SETTINGS
    return klass


def _serve(service: str, args: argparse.Namespace) -> int:
    klass = settings_class(service)
    settings = load_settings(klass, flags=flags_from_args(args, klass), config_file=args.config)
    configure_logging(settings.log_level, json=settings.log_json)
    security.configure(security.Security.from_settings(settings))
    server: Any = importlib.import_module(f"services.{service}.server")
    asyncio.run(server.serve(settings))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for service, description in SERVICES.items():
        group = subparsers.add_parser(service, help=description)
        commands = group.add_subparsers(dest=f"{service}_command", required=True, metavar="COMMAND")
        serve = commands.add_parser("serve", help=f"run the {service} service ({description})")
        add_settings_arguments(serve, settings_class(service))
        serve.set_defaults(handler=partial(_serve, service))
