"""Gateway-specific domain errors and the one mapping from domain errors to HTTP status codes.

Each dialect turns a `LodestarError` into its own error body; the status code comes from `http_status`
so every dialect agrees (Anthropic alone answers an unavailable backend with 529 `overloaded_error`).
"""

from __future__ import annotations

from lodestar import errors


class PayloadTooLargeError(errors.ResourceExhaustedError):
    """The request body is larger than `max_body_bytes` (HTTP 413)."""


class UnsupportedMediaTypeError(errors.InvalidArgumentError):
    """The request body is not JSON (HTTP 415)."""


class MethodNotAllowedError(errors.InvalidArgumentError):
    """The path exists but not for this HTTP method (HTTP 405)."""


class InternalError(errors.InternalError):
    """A bug in the gateway itself (HTTP 500); the details are in the log, never in the response."""


_STATUS: list[tuple[type[errors.LodestarError], int]] = [
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (MethodNotAllowedError, 405),
    (errors.InvalidArgumentError, 400),
    (errors.FailedPreconditionError, 400),
    (errors.UnauthenticatedError, 401),
    (errors.PermissionDeniedError, 403),
    (errors.NotFoundError, 404),
    (errors.AlreadyExistsError, 409),
    (errors.ResourceExhaustedError, 429),
    (errors.UnimplementedError, 501),
    (errors.UnavailableError, 503),
    (errors.DeadlineExceededError, 504),
    (errors.CancelledError, 499),
]


def http_status(error: errors.LodestarError) -> int:
    """The HTTP status of a domain error (500 for anything unmapped)."""
    for klass, status in _STATUS:
        if isinstance(error, klass):
            return status
    return 500
