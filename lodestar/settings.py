"""Typed settings, one object per service, layered flags > environment > config file > defaults.

Every service declares a `ServiceSettings` subclass with a `section` name. Values come from:

1. command-line flags (only those the user actually gave),
2. environment variables `LODESTAR_<SECTION>_<FIELD>` (e.g. `LODESTAR_INFERENCE_PORT=50051`),
3. the `[<section>]` table of a TOML config file (`--config PATH` or `LODESTAR_CONFIG`),
4. the field defaults.

A service may group fields into sections (`SettingsSection` fields, e.g. the trainer's `batch`): a section is the
`[<section>.<name>]` table of the file, the flags `--<name>.<field-name>` and the variables
`LODESTAR_<SECTION>_<NAME>__<FIELD>` (or the whole section as JSON in `LODESTAR_<SECTION>_<NAME>`); the layers
merge field by field. A key a service has moved into a section (its `moved` table) is refused with its new place.

Settings are built once in `main()` and passed down explicitly; nothing reads the environment later.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lodestar.errors import InvalidArgumentError

ENV_PREFIX = "LODESTAR_"
CONFIG_ENV = "LODESTAR_CONFIG"


class SettingsSection(BaseModel):
    """A group of a service's settings by concern: a nested table of its settings (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def sections_of(cls: type[BaseModel]) -> dict[str, type[SettingsSection]]:
    """The fields of `cls` that are sections, and their classes."""
    return {
        name: field.annotation
        for name, field in cls.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, SettingsSection)
    }


class ServiceSettings(BaseModel):
    """Settings every gRPC service shares."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    section: ClassVar[str] = "service"
    moved: ClassVar[Mapping[str, str]] = {}
    """Old keys -> their place now (`batch.micro_batch_tokens`): refused, with that place, wherever given."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved(cls, values: Any) -> Any:
        if isinstance(values, Mapping):
            for key in values:
                if key in cls.moved:
                    raise ValueError(moved_message(cls, key))
        return values

    host: str = "127.0.0.1"
    """Interface the gRPC server binds."""
    port: int = 0
    """gRPC port; 0 picks a free one (printed at start)."""
    log_level: str = "info"
    """Lowest level logged: debug, info, warning or error (an unknown name means info)."""
    log_json: bool | None = None
    """JSON log lines; unset means JSON when stderr is not a terminal."""
    drain_seconds: float = 10.0
    """On SIGTERM, how long in-flight RPCs may finish before they are cancelled."""
    tls_cert: Path | None = None
    """PEM certificate of this process: served on the gRPC port and presented to other services."""
    tls_key: Path | None = None
    """PEM private key of --tls-cert."""
    tls_ca: Path | None = None
    """PEM CA that signs the deployment's certificates: mutual TLS (clients must present a certificate it
    signed) and the trust root for channels to other services."""
    auth_token: str | None = None
    """This process's bearer token, sent by its clients. Without --auth-tokens-file it is also the one token
    this server accepts, with every role: required on every lodestar RPC but generation, model info and node
    counters (a laptop; docs/security.md, "Credentials per role")."""
    auth_token_file: Path | None = None
    """File holding the auth token (a mounted secret; used when --auth-token is not given)."""
    auth_tokens_file: Path | None = None
    """Token table of the deployment: `role[:identity] token` lines (roles operator, trainer, node:<node_id>,
    inference; a token may be written `sha256:<hex>`). With it this server accepts only these tokens, each
    for its role's RPCs (`lodestar auth tokens` writes one; docs/security.md, "Credentials per role")."""
    allow_insecure: bool = False
    """Serve on an address beyond loopback (--host) with neither a token nor mutual TLS. Without it such a
    server refuses to start: anyone who reaches the port could create runs (arbitrary commands on every
    node), push weights or read sessions."""
    max_receive_message_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    """Largest request message this server accepts (larger ones fail with RESOURCE_EXHAUSTED before any
    handler runs). Each service sizes it to its largest legitimate request (docs/grpc.md); 4 MiB here."""


class EtcdClientSettings(ServiceSettings):
    """Settings of a service that talks to etcd (rollout, gateway): how its etcd client is secured
    (docs/security.md, "etcd"). The endpoint itself is each service's `etcd` setting."""

    etcd_tls_ca: Path | None = None
    """PEM CA that signs etcd's server certificate (https:// etcd endpoints; default: the system's roots)."""
    etcd_tls_cert: Path | None = None
    """PEM client certificate presented to etcd (mutual TLS; with etcd's --client-cert-auth and auth enabled,
    its CN is the etcd user this service acts as)."""
    etcd_tls_key: Path | None = None
    """PEM private key of --etcd-tls-cert."""
    etcd_allow_insecure: bool = False
    """Talk plaintext http:// to an etcd beyond loopback. Without it such an endpoint refuses to start: anyone
    who reaches etcd could read every key and write node, session ownership and leader keys."""


S = TypeVar("S", bound=ServiceSettings)


def moved_message(cls: type[ServiceSettings], key: str) -> str:
    """Where the moved key `key` is now, in each of the three spellings."""
    section, _, name = cls.moved[key].partition(".")
    env = f"{ENV_PREFIX}{cls.section.upper()}_{section.upper()}__{name.upper()}"
    flag = f"--{section}.{name.replace('_', '-')}"
    return f"`{key}` has moved to `{section}.{name}`: `{name}` in the [{cls.section}.{section}] table, {flag}, {env}"


def _merge(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    """Merge one layer into the lower ones: a section (a table) field by field, anything else replaced."""
    for key, value in values.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _env_value(cls: type[ServiceSettings], variable: str, raw: str, name: str) -> Any:
    """Lists and tables come as JSON; scalars are coerced by pydantic from the string."""
    if raw[:1] not in ("[", "{"):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise InvalidArgumentError(
            f"invalid {cls.section} settings: {name}: {variable} is not valid JSON ({error.msg})"
        ) from error


def _env_values(cls: type[ServiceSettings], env: Mapping[str, str]) -> dict[str, Any]:
    prefix = f"{ENV_PREFIX}{cls.section.upper()}_"
    for key in cls.moved:
        if prefix + key.upper() in env:
            raise InvalidArgumentError(
                f"invalid {cls.section} settings: {prefix + key.upper()}: {moved_message(cls, key)}"
            )
    values: dict[str, Any] = {}
    for name in cls.model_fields:
        raw = env.get(prefix + name.upper())
        if raw is not None:
            values[name] = _env_value(cls, prefix + name.upper(), raw, name)
    for name, section in sections_of(cls).items():
        for field in section.model_fields:
            variable = f"{prefix}{name.upper()}__{field.upper()}"
            if (raw := env.get(variable)) is not None:
                _merge(values, {name: {field: _env_value(cls, variable, raw, f"{name}.{field}")}})
    return values


def _file_values(cls: type[ServiceSettings], config_file: Path) -> dict[str, Any]:
    try:
        document = tomllib.loads(config_file.read_text())
    except OSError as error:
        raise InvalidArgumentError(f"cannot read config file {config_file}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise InvalidArgumentError(f"config file {config_file} is not valid TOML: {error}") from error
    table = document.get(cls.section, {})
    if not isinstance(table, dict):
        raise InvalidArgumentError(f"config file {config_file}: [{cls.section}] must be a table")
    return table


def load_settings(
    cls: type[S],
    *,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> S:
    """Build `cls` from flags > env > config file > defaults.

    `flags` holds parsed command-line values; `None` values mean "not given" and fall through.
    `env` defaults to `os.environ`; the config file defaults to `$LODESTAR_CONFIG` when set.
    Raises InvalidArgumentError naming the offending setting.
    """
    environ = os.environ if env is None else env
    if config_file is None and environ.get(CONFIG_ENV):
        config_file = Path(environ[CONFIG_ENV])
    values: dict[str, Any] = {}
    if config_file is not None:
        _merge(values, _file_values(cls, config_file))
    _merge(values, _env_values(cls, environ))
    _merge(values, {key: value for key, value in (flags or {}).items() if value is not None})
    try:
        return cls.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors())
        raise InvalidArgumentError(f"invalid {cls.section} settings: {problems}") from error
