"""The domain error hierarchy.

Domain code raises these; they are mapped once to gRPC status codes (`lodestar.grpc.errors`) and once
to each vendor dialect's HTTP error body (the gateway). Messages are written for the caller: they must
never carry internals such as stack traces or file paths.
"""

from __future__ import annotations


class LodestarError(Exception):
    """Base of every error a caller is meant to see."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgumentError(LodestarError):
    """The request is malformed or violates a limit (gRPC INVALID_ARGUMENT, HTTP 400)."""


class NotFoundError(LodestarError):
    """A named entity does not exist (gRPC NOT_FOUND, HTTP 404)."""


class AlreadyExistsError(LodestarError):
    """The entity to create exists already (gRPC ALREADY_EXISTS, HTTP 409)."""


class FailedPreconditionError(LodestarError):
    """The system is not in a state where the request can run, e.g. a stale attempt (FAILED_PRECONDITION)."""


class UnauthenticatedError(LodestarError):
    """Missing or unknown credentials, e.g. an unknown session key (gRPC UNAUTHENTICATED, HTTP 401)."""


class PermissionDeniedError(LodestarError):
    """The caller is known but may not do this, e.g. a path outside the configured directories (gRPC
    PERMISSION_DENIED, HTTP 403)."""


class ResourceExhaustedError(LodestarError):
    """A quota or size limit was hit, e.g. an oversized body (gRPC RESOURCE_EXHAUSTED, HTTP 413/429)."""


class UnavailableError(LodestarError):
    """A dependency is down or starting; the caller should retry (gRPC UNAVAILABLE, HTTP 503)."""


class DeadlineExceededError(LodestarError):
    """An operation ran past its timeout (gRPC DEADLINE_EXCEEDED, HTTP 504)."""


class CancelledError(LodestarError):
    """The operation was cancelled by its caller or by shutdown (gRPC CANCELLED)."""


class InternalError(LodestarError):
    """A bug or an unexpected failure inside a service, not the caller's fault and not transient (gRPC
    INTERNAL, HTTP 500): never retried automatically. The message stays generic; details go to the log."""


class ContextLengthExceededError(InvalidArgumentError):
    """The prompt leaves no room for output in the model's context (gRPC INVALID_ARGUMENT with the numbers in
    trailing metadata, so the gateway can answer in each vendor's own words)."""

    def __init__(self, prompt_tokens: int, context_length: int) -> None:
        super().__init__(f"the prompt has {prompt_tokens} tokens but the context length is {context_length} tokens")
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


class UnimplementedError(LodestarError):
    """The operation is not implemented by this server (gRPC UNIMPLEMENTED, HTTP 501)."""
