"""lodestar/sampling.py: which sampling a call uses under a policy, a policy's checks and defaults, and which
policies a trainer can train on."""

from __future__ import annotations

import pytest

from lodestar.errors import InvalidArgumentError
from lodestar.sampling import applied_sampling, check_trainable, resolved_policy, validate_policy
from lodestar.v1 import common_pb2

GEMINI_CLI = common_pb2.SamplingParams(temperature=1.0, top_p=0.95, top_k=64, max_tokens=900, seed=7, stop=["\n\n"])
"""What Gemini CLI sends (plus a limit, a seed and a stop sequence, which stay the client's)."""


def test_a_run_policy_replaces_temperature_top_p_and_top_k_and_keeps_the_rest() -> None:
    used = applied_sampling(GEMINI_CLI, common_pb2.SamplingPolicy(temperature=0.7))
    assert (round(used.temperature, 6), used.top_p, used.top_k) == (0.7, 1.0, 0)
    assert (used.max_tokens, used.seed, list(used.stop)) == (900, 7, ["\n\n"])
    assert GEMINI_CLI.top_p == pytest.approx(0.95), "the request is left as it was"


def test_every_value_is_explicit_whatever_was_asked() -> None:
    for policy in (None, common_pb2.SamplingPolicy(), common_pb2.SamplingPolicy(mode=common_pb2.SAMPLING_MODE_HARNESS)):
        used = applied_sampling(common_pb2.SamplingParams(), policy)
        assert used.HasField("temperature")
        assert used.HasField("top_p")
        assert used.HasField("top_k")
        assert (used.temperature, used.top_p, used.top_k) == (1.0, 1.0, 0)


def test_without_a_policy_or_in_harness_mode_the_client_decides() -> None:
    harness_mode = common_pb2.SamplingPolicy(mode=common_pb2.SAMPLING_MODE_HARNESS, temperature=0.2)
    for policy in (None, harness_mode):
        used = applied_sampling(GEMINI_CLI, policy)
        assert (used.temperature, used.top_p, used.top_k) == (1.0, pytest.approx(0.95), 64)


def test_resolved_policy_fills_the_mode_and_the_defaults() -> None:
    resolved = resolved_policy(common_pb2.SamplingPolicy(top_k=5))
    assert resolved == common_pb2.SamplingPolicy(mode=common_pb2.SAMPLING_MODE_RUN, temperature=1.0, top_p=1.0, top_k=5)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (common_pb2.SamplingPolicy(temperature=0.0), "temperature must be > 0"),
        (common_pb2.SamplingPolicy(temperature=float("nan")), "temperature must be > 0"),
        (common_pb2.SamplingPolicy(top_p=1.01), "top_p must be in"),
        (common_pb2.SamplingPolicy(top_k=-1), "top_k must be >= 0"),
        (common_pb2.SamplingPolicy(mode=common_pb2.SAMPLING_MODE_HARNESS), "mode HARNESS"),
        (common_pb2.SamplingPolicy(top_p=0.9), "top_p 0.9: the trainer recomputes temperature-only"),
        (common_pb2.SamplingPolicy(top_k=40), "top_k 40: the trainer recomputes temperature-only"),
    ],
)
def test_policies_a_trainer_cannot_train_on_are_refused(policy: common_pb2.SamplingPolicy, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        check_trainable(policy)


def test_trainable_policies_pass() -> None:
    for policy in (
        common_pb2.SamplingPolicy(),
        common_pb2.SamplingPolicy(temperature=0.6, top_p=1.0, top_k=0),
        common_pb2.SamplingPolicy(mode=common_pb2.SAMPLING_MODE_RUN, temperature=1.3),
    ):
        check_trainable(policy)
    validate_policy(common_pb2.SamplingPolicy(mode=common_pb2.SAMPLING_MODE_HARNESS, top_p=0.5, top_k=3))
