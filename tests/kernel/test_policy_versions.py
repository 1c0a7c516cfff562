"""`lodestar.policy_versions`: the one reading of a call's `policy_version` and `policy_version_spans`."""

from __future__ import annotations

import pytest

from lodestar.policy_versions import call_token_versions, call_version_range, spans_of, token_versions
from lodestar.v1 import common_pb2


def _span(version: int, start: int, end: int) -> common_pb2.PolicyVersionSpan:
    return common_pb2.PolicyVersionSpan(policy_version=version, start=start, end=end)


def _call(version: int, count: int, *spans: common_pb2.PolicyVersionSpan) -> common_pb2.CallRecord:
    return common_pb2.CallRecord(
        policy_version=version, completion_token_ids=list(range(count)), policy_version_spans=list(spans)
    )


def test_a_call_without_spans_is_one_version() -> None:
    call = _call(7, 4)
    assert call_token_versions(call) == [7, 7, 7, 7]
    assert call_version_range(call) == (7, 7)


def test_spans_give_each_token_its_version() -> None:
    call = _call(2, 6, _span(2, 0, 2), _span(3, 2, 5), _span(4, 5, 6))
    assert call_token_versions(call) == [2, 2, 3, 3, 3, 4]
    assert call_version_range(call) == (2, 4)


@pytest.mark.parametrize(
    ("spans", "count", "why"),
    [
        ([_span(1, 0, 2), _span(2, 3, 5)], 5, "not contiguous"),  # a gap
        ([_span(1, 0, 3), _span(2, 2, 5)], 5, "not contiguous"),  # an overlap
        ([_span(1, 1, 5)], 5, "not contiguous"),  # not from the first token
        ([_span(1, 0, 2), _span(2, 2, 2)], 2, "not contiguous"),  # an empty span
        ([_span(1, 0, 2), _span(2, 2, 4)], 5, "cover 4 tokens; the call sampled 5"),
        ([_span(1, 0, 2), _span(2, 2, 6)], 5, "cover 6 tokens; the call sampled 5"),
        ([_span(0, 0, 2), _span(2, 2, 5)], 5, "start with version 0; the call says 1"),
    ],
)
def test_spans_that_do_not_cover_the_tokens_are_refused(
    spans: list[common_pb2.PolicyVersionSpan], count: int, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        token_versions(1, spans, count)


def test_spans_of_merges_runs_and_drops_a_single_version() -> None:
    assert spans_of([5, 5, 5]) == []
    assert spans_of([]) == []
    got = [(s.policy_version, s.start, s.end) for s in spans_of([1, 1, 2, 2, 2, 3])]
    assert got == [(1, 0, 2), (2, 2, 5), (3, 5, 6)]
    call = _call(1, 6, *spans_of([1, 1, 2, 2, 2, 3]))
    assert call_token_versions(call) == [1, 1, 2, 2, 2, 3]
