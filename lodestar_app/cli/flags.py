"""Command-line flags derived from a settings class.

Every field of a `ServiceSettings` subclass becomes `--field-name` (booleans get `--x/--no-x`), with the
field's docstring as help (a field a subclass redeclares without one keeps its base class's). Flags not given
parse to None and fall through to env, file and defaults, so flags, env and config file never drift apart.

A renamed flag keeps no old spelling (CONTRIBUTING.md, "CLI conventions"): the old one is an argparse error.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from lodestar.settings import ServiceSettings


def _scalar_type(annotation: Any) -> Any:
    """Strip Optional[...] and return the annotation argparse should convert to."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        return inner[0] if len(inner) == 1 else str
    return annotation


def _help(settings_class: type[ServiceSettings], name: str) -> str:
    """The docstring of field `name`: the class's own, else the nearest base class's."""
    for cls in settings_class.__mro__:
        fields = getattr(cls, "model_fields", {})
        if name in fields and fields[name].description:
            return str(fields[name].description)
    return ""


def add_settings_arguments(parser: argparse.ArgumentParser, settings_class: type[ServiceSettings]) -> None:
    """Add one flag per settings field (defaults None: 'not given')."""
    for name, field in settings_class.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = _help(settings_class, name).replace("%", "%%")
        kind = _scalar_type(field.annotation)
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif get_origin(kind) is Literal:
            parser.add_argument(flag, dest=name, choices=list(get_args(kind)), default=None, help=help_text)
        elif get_origin(kind) is list:
            (item,) = get_args(kind) or (str,)
            parser.add_argument(flag, dest=name, nargs="*", type=item, default=None, help=help_text)
        elif kind in (int, float, str, Path):
            parser.add_argument(flag, dest=name, type=kind, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)
    parser.add_argument("--config", type=Path, default=None, help="TOML config file (or $LODESTAR_CONFIG)")


def flags_from_args(args: argparse.Namespace, settings_class: type[ServiceSettings]) -> dict[str, Any]:
    """The settings fields the user gave on the command line."""
    return {name: getattr(args, name) for name in settings_class.model_fields if getattr(args, name, None) is not None}
