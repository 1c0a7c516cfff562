"""Verifiers: one module per `VerifierSpec.kind` and this small registry.

`make_verifier(spec)` builds one from its config (InvalidArgumentError for an unknown kind or a bad
config). A verifier's `score(input)` returns a `Verdict`, raises `VerifierError` (a failure of the node,
the runtime, the verifier's own code or the dataset: infrastructure, never a reward) or `AgentFailure` (the
agent caused it: the verdict is the lowest reward of the range with `details.agent_failure`, the reason).
Every verdict is checked (`base.checked_verdict`): a reward that is not a finite number is a VerifierError,
one outside the config's `reward_range` (default [0, 1]) is clamped into it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lodestar.errors import InvalidArgumentError
from lodestar.v1 import rollout_pb2
from lodestar_gateway.node.verifiers.base import (
    AgentFailure,
    Verdict,
    Verifier,
    VerifierError,
    VerifierInput,
    agent_failure_verdict,
    checked_verdict,
    config_dict,
    reward_range,
)
from lodestar_gateway.node.verifiers.command import CommandVerifier
from lodestar_gateway.node.verifiers.exact_match import ExactMatchVerifier
from lodestar_gateway.node.verifiers.python import PythonVerifier
from lodestar_gateway.node.verifiers.swe import SweVerifier

VERIFIERS: dict[str, Callable[[dict[str, Any]], Verifier]] = {
    CommandVerifier.kind: CommandVerifier,
    ExactMatchVerifier.kind: ExactMatchVerifier,
    PythonVerifier.kind: PythonVerifier,
    SweVerifier.kind: SweVerifier,
}


class BoundedVerifier:
    """A verifier whose verdicts are checked against its declared reward range."""

    def __init__(self, inner: Verifier, bounds: tuple[float, float]) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.bounds = bounds

    async def score(self, given: VerifierInput) -> Verdict:
        try:
            verdict = await self.inner.score(given)
        except AgentFailure as failure:
            return agent_failure_verdict(failure, self.bounds, self.kind)
        return checked_verdict(verdict, self.bounds, self.kind)


def make_verifier(spec: rollout_pb2.VerifierSpec) -> Verifier:
    factory = VERIFIERS.get(spec.kind)
    if factory is None:
        raise InvalidArgumentError(f"unknown verifier kind {spec.kind!r}; one of {', '.join(VERIFIERS)}")
    config = config_dict(spec.config)
    return BoundedVerifier(factory(config), reward_range(config, spec.kind))


__all__ = ["VERIFIERS", "AgentFailure", "Verdict", "Verifier", "VerifierError", "VerifierInput", "make_verifier"]
