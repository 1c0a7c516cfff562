"""Verifiers: one module per `VerifierSpec.kind` and this small registry.

`make_verifier(spec)` builds one from its config (InvalidArgumentError for an unknown kind or a bad
config). A verifier's `score(input)` returns a `Verdict` or raises `VerifierError`: a crash or timeout is
an infrastructure failure, never a reward of 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from services.gateway.node.verifiers.base import Verdict, Verifier, VerifierError, VerifierInput, config_dict
from services.gateway.node.verifiers.command import CommandVerifier
from services.gateway.node.verifiers.exact_match import ExactMatchVerifier
from services.gateway.node.verifiers.python import PythonVerifier
from services.gateway.node.verifiers.swe import SweVerifier

VERIFIERS: dict[str, Callable[[dict[str, Any]], Verifier]] = {
    CommandVerifier.kind: CommandVerifier,
    ExactMatchVerifier.kind: ExactMatchVerifier,
    PythonVerifier.kind: PythonVerifier,
    SweVerifier.kind: SweVerifier,
}


def make_verifier(spec: rollout_pb2.VerifierSpec) -> Verifier:
    factory = VERIFIERS.get(spec.kind)
    if factory is None:
        raise InvalidArgumentError(f"unknown verifier kind {spec.kind!r}; one of {', '.join(VERIFIERS)}")
    return factory(config_dict(spec.config))


__all__ = ["VERIFIERS", "Verdict", "Verifier", "VerifierError", "VerifierInput", "make_verifier"]
