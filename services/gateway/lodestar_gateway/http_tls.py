"""TLS of the gateway's vendor-API HTTP port, and the warning when it is exposed without it.

Harnesses authenticate with their session key, which travels in a header: on a non-loopback interface
without TLS anyone on the path can read it. `ssl_context` builds the server context from
`--http-tls-cert/--http-tls-key`; `exposure_warning` says what is wrong when the port is bound beyond
loopback without TLS (the server logs it at start).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from lodestar.errors import InvalidArgumentError
from lodestar.grpc.security import is_loopback

__all__ = ["exposure_warning", "is_loopback", "ssl_context"]


def ssl_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """A TLS server context for the HTTP port, or None when no certificate is configured."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InvalidArgumentError("--http-tls-cert and --http-tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise InvalidArgumentError(f"cannot load the HTTP TLS certificate {cert}: {error}") from error
    return context


def exposure_warning(host: str, tls: bool) -> str | None:
    """The warning to log for an HTTP port on `host`, or None when it is loopback-only or uses TLS."""
    if tls or is_loopback(host):
        return None
    return (
        f"the vendor-API HTTP port is bound to {host or 'every interface'} without TLS: session keys and "
        "prompts cross the network in clear text (set --http-tls-cert/--http-tls-key, or bind 127.0.0.1)"
    )
