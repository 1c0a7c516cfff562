"""Which policy version sampled which token of a call: the one reading of `policy_version_spans`.

Inference can swap weights under a running request (the vllm backend's no-drain swap): the call's tokens
before the swap were sampled by one version, those after it by the next. The call then carries
`policy_version_spans` (common.proto `PolicyVersionSpan`: [start, end) ranges of its completion tokens with
their version), and its `policy_version` is the first token's version. A call without spans was sampled
wholly by `policy_version`, which is every call of an engine that never swaps under a request (and every
record written before spans existed). Rollout (a session's oldest and newest version) and the trainer
(each target token's version: staleness, the mismatch metric) must read the two fields the same way, so
the reading lives here, in the kernel, once.
"""

from __future__ import annotations

from collections.abc import Sequence

from lodestar.v1 import common_pb2


def token_versions(policy_version: int, spans: Sequence[common_pb2.PolicyVersionSpan], count: int) -> list[int]:
    """The version of each of `count` sampled tokens: `policy_version` for all of them without spans.

    Raises ValueError when the spans do not cover [0, count) in order without gaps or overlaps, or when the
    first span's version is not `policy_version` (a record that contradicts itself is not trained on with
    guessed versions)."""
    if not spans:
        return [policy_version] * count
    if spans[0].policy_version != policy_version:
        raise ValueError(
            f"policy_version_spans start with version {spans[0].policy_version}; the call says {policy_version}"
        )
    versions: list[int] = []
    for span in spans:
        if span.start != len(versions) or span.end <= span.start:
            raise ValueError(
                f"policy_version_spans are not contiguous: span [{span.start}, {span.end}) after {len(versions)} tokens"
            )
        versions.extend([span.policy_version] * (span.end - span.start))
    if len(versions) != count:
        raise ValueError(f"policy_version_spans cover {len(versions)} tokens; the call sampled {count}")
    return versions


def call_token_versions(call: common_pb2.CallRecord) -> list[int]:
    """The version of each sampled token of `call` (see `token_versions`)."""
    return token_versions(call.policy_version, call.policy_version_spans, len(call.completion_token_ids))


def call_version_range(call: common_pb2.CallRecord) -> tuple[int, int]:
    """The oldest and newest version that sampled a token of `call` (without spans: its policy_version twice)."""
    versions = [call.policy_version, *(span.policy_version for span in call.policy_version_spans)]
    return min(versions), max(versions)


def spans_of(versions: Sequence[int]) -> list[common_pb2.PolicyVersionSpan]:
    """The spans of per-token `versions`; empty when one version sampled every token (no spans needed)."""
    spans: list[common_pb2.PolicyVersionSpan] = []
    for index, version in enumerate(versions):
        if spans and spans[-1].policy_version == version:
            spans[-1].end = index + 1
        else:
            spans.append(common_pb2.PolicyVersionSpan(policy_version=version, start=index, end=index + 1))
    return spans if len(spans) > 1 else []
