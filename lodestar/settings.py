"""Typed settings, one object per service, layered flags > environment > config file > defaults.

Every service declares a `ServiceSettings` subclass with a `section` name. Values come from:

1. command-line flags (only those the user actually gave),
2. environment variables `LODESTAR_<SECTION>_<FIELD>` (e.g. `LODESTAR_INFERENCE_PORT=50051`),
3. the `[<section>]` table of a TOML config file (`--config PATH` or `LODESTAR_CONFIG`),
4. the field defaults.

Settings are built once in `main()` and passed down explicitly; nothing reads the environment later.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lodestar.errors import InvalidArgumentError

ENV_PREFIX = "LODESTAR_"
CONFIG_ENV = "LODESTAR_CONFIG"


class ServiceSettings(BaseModel):
    """Settings every gRPC service shares."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    section: ClassVar[str] = "service"

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


def _env_values(cls: type[ServiceSettings], env: Mapping[str, str]) -> dict[str, Any]:
    prefix = f"{ENV_PREFIX}{cls.section.upper()}_"
    values: dict[str, Any] = {}
    for name in cls.model_fields:
        raw = env.get(prefix + name.upper())
        if raw is None:
            continue
        # Lists and tables come as JSON; scalars are coerced by pydantic from the string.
        if raw[:1] in ("[", "{"):
            try:
                values[name] = json.loads(raw)
            except json.JSONDecodeError as error:
                raise InvalidArgumentError(
                    f"invalid {cls.section} settings: {name}: {prefix}{name.upper()} is not valid JSON ({error.msg})"
                ) from error
        else:
            values[name] = raw
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
        values.update(_file_values(cls, config_file))
    values.update(_env_values(cls, environ))
    values.update({key: value for key, value in (flags or {}).items() if value is not None})
    try:
        return cls.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors())
        raise InvalidArgumentError(f"invalid {cls.section} settings: {problems}") from error
