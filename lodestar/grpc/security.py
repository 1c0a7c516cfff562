"""Transport security of every lodestar gRPC server and client: TLS (mutual when a CA is given) and the
bearer tokens of the control plane.

`Security` is built once in `main()` from a service's settings (`--tls-cert/--tls-key/--tls-ca`,
`--auth-token` or `--auth-token-file`, `--auth-tokens-file`) and installed with `configure()`;
`GrpcServer` and `connect()` use the configured one unless they are handed another. (A deliberate
deviation from "no process-wide state": every channel of a process talks to the same deployment with
the same identity, and threading one object through every client constructor of four services would
touch dozens of call sites.)

- Server: with a certificate it binds a TLS port; with a CA it also requires and verifies client
  certificates (mutual TLS). With a token table (`--auth-tokens-file`, `lodestar.grpc.roles`) every
  lodestar RPC needs the metadata `authorization: Bearer <token>` of a role allowed to call it, except the
  few in `roles.OPEN_METHODS` (generation, model info, node counters); health and reflection (not lodestar
  services) stay open. With only a single token, that token has every role (a laptop). The checks are
  `lodestar.grpc.auth`'s interceptor.
- Exposure (`check_exposure`): a server bound beyond loopback with neither a token nor mutual TLS refuses
  to start unless its settings say `allow_insecure` (docs/security.md, "Secure defaults").
- Client: with a CA or a certificate it opens a TLS channel (trusting the CA, presenting its own
  certificate when it has one); with a token it sends it on every call.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from lodestar.errors import FailedPreconditionError, InvalidArgumentError
from lodestar.grpc.auth import AUTH_METADATA_KEY, RoleInterceptor
from lodestar.grpc.roles import TokenTable, needs_token

__all__ = [
    "AUTH_METADATA_KEY",
    "Security",
    "check_exposure",
    "configure",
    "current",
    "is_loopback",
    "needs_token",
]

_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """Whether a bind address is only reachable from this machine ("127.0.0.1", "::1", "localhost"); any
    other name may resolve to anything and "" means every interface, so they are not loopback. Used for the
    gRPC ports here and for the gateway's HTTP port."""
    if host.strip().lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, security: Security, *, allow_insecure: bool, what: str) -> bool:
    """Refuse (FailedPreconditionError) to serve `what` on `host` beyond loopback with neither a token nor
    mutual TLS, unless `allow_insecure`; returns True when the server is exposed without either (allowed)."""
    if is_loopback(host) or security.authenticates or security.mutual_tls:
        return False
    if allow_insecure:
        return True
    raise FailedPreconditionError(
        f"refusing to serve {what} on {host} (beyond loopback) without authentication: give a control-plane "
        "token (--auth-token-file or --auth-token) or mutual TLS (--tls-cert, --tls-key and --tls-ca), bind "
        "127.0.0.1, or pass --allow-insecure to serve it open to anyone who can reach it"
    )


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise InvalidArgumentError(f"cannot read {what} {path}: {error.strerror}") from error


@dataclass(frozen=True)
class Security:
    """TLS files and the control-plane token of one process (all optional: nothing set = plaintext, open)."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    token: str | None = None
    """What this process sends; without `table` also the one token its servers accept, with every role."""
    table: TokenTable | None = None
    """The tokens this process's servers accept, each for its role's methods (`roles.METHOD_ROLES`)."""

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgumentError("--tls-cert and --tls-key go together")
        if self.token is not None and not self.token.strip():
            raise InvalidArgumentError("the auth token is empty")

    @classmethod
    def from_settings(cls, settings: Any) -> Security:
        """From a `ServiceSettings` (tls_cert, tls_key, tls_ca, auth_token, auth_token_file,
        auth_tokens_file)."""
        token: str | None = settings.auth_token
        if token is None and settings.auth_token_file is not None:
            token = _read(settings.auth_token_file, "auth token file").decode().strip()
        table = TokenTable.read(settings.auth_tokens_file) if settings.auth_tokens_file is not None else None
        return cls(settings.tls_cert, settings.tls_key, settings.tls_ca, token, table)

    @property
    def authenticates(self) -> bool:
        """Whether this process's servers check tokens (a table, or the single all-roles token)."""
        return self.table is not None or bool(self.token)

    @property
    def mutual_tls(self) -> bool:
        """Whether a server with these settings requires client certificates signed by the CA."""
        return self.tls_cert is not None and self.tls_ca is not None

    @property
    def client_tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials for a server port (client certificates required when a CA is set), or None."""
        if self.tls_cert is None or self.tls_key is None:
            if self.tls_ca is not None:
                raise InvalidArgumentError("--tls-ca on a server needs --tls-cert and --tls-key")
            return None
        pair = (_read(self.tls_key, "TLS key"), _read(self.tls_cert, "TLS certificate"))
        ca = _read(self.tls_ca, "TLS CA") if self.tls_ca is not None else None
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials for a client channel, or None for plaintext."""
        if not self.client_tls:
            return None
        ca = _read(self.tls_ca, "TLS CA") if self.tls_ca is not None else None
        key = _read(self.tls_key, "TLS key") if self.tls_key is not None else None
        cert = _read(self.tls_cert, "TLS certificate") if self.tls_cert is not None else None
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def client_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((AUTH_METADATA_KEY, f"Bearer {self.token}"),) if self.token else ()

    def client_interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        """Interceptors that send the token on every call (none without a token)."""
        if not self.token:
            return []
        metadata = self.client_metadata()
        return [
            _UnaryUnaryToken(metadata),
            _UnaryStreamToken(metadata),
            _StreamUnaryToken(metadata),
            _StreamStreamToken(metadata),
        ]

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """Token checks of this process's servers: the table's roles, else the one token with every role."""
        if self.table is not None:
            return [RoleInterceptor(self.table)]
        return [RoleInterceptor(TokenTable.all_roles(self.token))] if self.token else []

    def aio_channel(
        self, target: str, *, options: list[tuple[str, Any]] | None = None, **kwargs: Any
    ) -> grpc.aio.Channel:
        """An async channel to `target` with this process's TLS and token (`interceptors` are appended)."""
        interceptors = [*self.client_interceptors(), *kwargs.pop("interceptors", [])]
        credentials = self.channel_credentials()
        if credentials is None:
            return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors, **kwargs)
        return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors, **kwargs)

    def sync_channel(self, target: str, *, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
        """A synchronous channel to `target` with this process's TLS and token."""
        credentials = self.channel_credentials()
        channel = (
            grpc.insecure_channel(target, options=options)
            if credentials is None
            else grpc.secure_channel(target, credentials, options=options)
        )
        if self.token:
            channel = grpc.intercept_channel(channel, _SyncToken(self.client_metadata()))
        return channel


_current = Security()


def configure(security: Security) -> None:
    """Install `security` as this process's default (call once from `main()`, before any server/channel)."""
    global _current
    _current = security


def current() -> Security:
    """This process's security settings (plaintext and open until `configure()` is called)."""
    return _current


class _Token:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# grpc.aio files each interceptor under the FIRST call kind it implements, so one class per kind.
class _UnaryUnaryToken(_Token, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _UnaryStreamToken(_Token, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _StreamUnaryToken(_Token, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStreamToken(_Token, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _SyncToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """The token on every call of a synchronous channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> Any:
        return _SyncDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), *self._metadata],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(client_call_details), request_iterator)


@dataclass(frozen=True)
class _SyncDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any
