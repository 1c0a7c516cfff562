"""Command-line flags derived from a settings class.

Every field of a `ServiceSettings` subclass becomes `--field-name` (booleans get `--x/--no-x`), with the
field's docstring as help (a field a subclass redeclares without one keeps its base class's); a section's
field becomes `--section.field-name`. Flags not given parse to None and fall through to env, file and
defaults, so flags, env and config file never drift apart. A key the settings have moved into a section
(their `moved` table) is a hidden flag that fails with its new place.

A renamed flag keeps no old spelling (CONTRIBUTING.md, "CLI conventions"): the old one is an argparse error.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from lodestar.settings import ServiceSettings, moved_message, sections_of


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


def _add_field(parser: argparse.ArgumentParser, flag: str, dest: str, annotation: Any, help_text: str) -> None:
    kind = _scalar_type(annotation)
    help_text = help_text.replace("%", "%%")
    if kind is bool:
        parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif get_origin(kind) is Literal:
        parser.add_argument(flag, dest=dest, choices=list(get_args(kind)), default=None, help=help_text)
    elif get_origin(kind) is list:
        (item,) = get_args(kind) or (str,)
        parser.add_argument(flag, dest=dest, nargs="*", type=item, default=None, help=help_text)
    elif kind in (int, float, str, Path):
        parser.add_argument(flag, dest=dest, type=kind, default=None, help=help_text)
    else:
        parser.add_argument(flag, dest=dest, default=None, help=help_text)


class _Moved(argparse.Action):
    """The flag of a key the settings moved into a section: an error naming its new place."""

    def __init__(self, option_strings: Sequence[str], dest: str, message: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.message = message

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *args: Any) -> None:
        parser.error(self.message)


def add_settings_arguments(parser: argparse.ArgumentParser, settings_class: type[ServiceSettings]) -> None:
    """Add one flag per settings field and per field of each section (defaults None: 'not given')."""
    sections = sections_of(settings_class)
    for name, field in settings_class.model_fields.items():
        if name not in sections:
            _add_field(parser, "--" + name.replace("_", "-"), name, field.annotation, _help(settings_class, name))
            continue
        for inner, part in sections[name].model_fields.items():
            flag = f"--{name}.{inner.replace('_', '-')}"
            _add_field(parser, flag, f"{name}.{inner}", part.annotation, part.description or "")
    for old in settings_class.moved:
        message = moved_message(settings_class, old)
        flag = "--" + old.replace("_", "-")
        parser.add_argument(
            flag, action=_Moved, message=message, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    parser.add_argument("--config", type=Path, default=None, help="TOML config file (or $LODESTAR_CONFIG)")


def flags_from_args(args: argparse.Namespace, settings_class: type[ServiceSettings]) -> dict[str, Any]:
    """The settings fields the user gave on the command line (a section's as a nested table)."""
    given: dict[str, Any] = {}
    sections = sections_of(settings_class)
    for name in settings_class.model_fields:
        if name not in sections:
            if getattr(args, name, None) is not None:
                given[name] = getattr(args, name)
            continue
        inner = {key: getattr(args, f"{name}.{key}", None) for key in sections[name].model_fields}
        if any(value is not None for value in inner.values()):
            given[name] = {key: value for key, value in inner.items() if value is not None}
    return given
