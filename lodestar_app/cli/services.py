"""`lodestar {inference,gateway,rollout,trainer} serve`: start one service in the foreground.

`REGISTRY` is the typed list of services: each entry names its `ServiceSettings` subclass (flags are
generated from its fields) and a `serve` function that imports the service's server module on call (so
`lodestar --help` stays light). A service whose distribution is not installed here (each image installs one:
docs/architecture.md "Packages") keeps its command, which then says how to install it.
`lodestar inference serve` without `--model` serves the embedded tiny model, built on first use into
`.lodestar/tiny-model` (as `lodestar up` does).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from lodestar.grpc import security
from lodestar.logging import configure_logging, get_logger
from lodestar.settings import ServiceSettings, load_settings
from lodestar_app.cli.flags import add_settings_arguments, flags_from_args
from lodestar_app.cli.missing import register_missing

if TYPE_CHECKING:
    from lodestar_gateway.settings import GatewaySettings
    from lodestar_inference.settings import InferenceSettings
    from lodestar_rollout.settings import RolloutSettings
    from lodestar_trainer.settings import TrainerSettings

S = TypeVar("S", bound=ServiceSettings)
DEFAULT_TINY_MODEL = Path(".lodestar/tiny-model")


@dataclass(frozen=True)
class Service(Generic[S]):
    """One service the CLI can serve."""

    name: str
    description: str
    settings_class: str
    """`module:Class` of its ServiceSettings subclass, imported on first use."""
    serve: Callable[[S], Coroutine[Any, Any, None]]

    @property
    def package(self) -> str:
        return self.settings_class.split(".")[0]

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    @property
    def settings(self) -> type[S]:
        module, _, name = self.settings_class.partition(":")
        found: type[S] = getattr(importlib.import_module(module), name)
        return found


async def _serve_inference(settings: InferenceSettings) -> None:
    from lodestar_inference.server import serve

    if settings.model is None:
        settings = settings.model_copy(update={"model": await asyncio.to_thread(_tiny_model, DEFAULT_TINY_MODEL)})
    await serve(settings)


def _tiny_model(directory: Path) -> Path:
    """The embedded tiny model, built into `directory` the first time (~5 s), reused after."""
    if not (directory / "config.json").is_file():
        from lodestar_inference.tiny_model import build

        get_logger("cli").info("no --model given: building the embedded tiny model", directory=str(directory))
        build(directory)
    return directory.resolve()


async def _serve_gateway(settings: GatewaySettings) -> None:
    from lodestar_gateway.server import serve

    await serve(settings)


async def _serve_rollout(settings: RolloutSettings) -> None:
    from lodestar_rollout.server import serve

    await serve(settings)


async def _serve_trainer(settings: TrainerSettings) -> None:
    from lodestar_trainer.server import serve

    await serve(settings)


REGISTRY: tuple[Service[Any], ...] = (
    Service(
        "inference",
        "token-faithful generation with logprob capture",
        "lodestar_inference.settings:InferenceSettings",
        _serve_inference,
    ),
    Service(
        "gateway", "vendor-API proxy and session capture", "lodestar_gateway.settings:GatewaySettings", _serve_gateway
    ),
    Service(
        "rollout", "session scheduler and durable store", "lodestar_rollout.settings:RolloutSettings", _serve_rollout
    ),
    Service("trainer", "GRPO trainer", "lodestar_trainer.settings:TrainerSettings", _serve_trainer),
)


def _serve(service: Service[Any], args: argparse.Namespace) -> int:
    settings = load_settings(service.settings, flags=flags_from_args(args, service.settings), config_file=args.config)
    configure_logging(settings.log_level, json=settings.log_json)
    security.configure(security.Security.from_settings(settings))
    asyncio.run(service.serve(settings))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for service in REGISTRY:
        group = subparsers.add_parser(service.name, help=service.description)
        commands = group.add_subparsers(dest=f"{service.name}_command", required=True, metavar="COMMAND")
        if not service.installed:
            register_missing(commands, "serve", service.name, f"run the {service.name} service")
            continue
        serve = commands.add_parser("serve", help=f"run the {service.name} service ({service.description})")
        add_settings_arguments(serve, service.settings)
        serve.set_defaults(handler=partial(_serve, service))
