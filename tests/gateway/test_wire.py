"""The capture's wire splice: a final's packed prompt ids framed as the CallRecord field parse to exactly the
record that re-encoding them gives; anything not in the plain packed form falls back (None)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lodestar.v1 import common_pb2, inference_pb2
from services.gateway.canonical import text_part
from services.gateway.wire import RECORD_PROMPT_IDS, WireFinal, decode_response, frame_len_field

ids = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=300)


@given(prompt=ids, completion=ids)
def test_spliced_record_equals_reencoded_record(prompt: list[int], completion: list[int]) -> None:
    final = inference_pb2.GenerateFinal(
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        message=common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, content=[text_part("OK.")]),
        policy_version=7,
        continuation_used=True,
    )
    decoded = decode_response(inference_pb2.GenerateResponse(final=final).SerializeToString())
    if not prompt:  # proto3 omits an empty packed field: nothing to splice
        assert isinstance(decoded, inference_pb2.GenerateResponse)
        return
    assert isinstance(decoded, WireFinal)
    assert decoded.response.final == final
    rest = common_pb2.CallRecord(session_id="s", sequence=3, completion_token_ids=completion, completion=final.message)
    spliced = common_pb2.CallRecord.FromString(
        frame_len_field(RECORD_PROMPT_IDS, decoded.packed_prompt_ids) + rest.SerializeToString()
    )
    expected = common_pb2.CallRecord()
    expected.CopyFrom(rest)
    expected.prompt_token_ids.extend(prompt)
    assert spliced == expected
    assert list(spliced.prompt_token_ids) == prompt


def test_deltas_and_non_packed_finals_are_not_spliced() -> None:
    delta = inference_pb2.GenerateResponse(delta=inference_pb2.GenerateDelta(text="hi"))
    assert isinstance(decode_response(delta.SerializeToString()), inference_pb2.GenerateResponse)
    # prompt ids sent unpacked (field 1 as varints, legal on the wire): decoded, but not spliced
    final_body = b"\x08\x05\x08\x06"
    unpacked = b"\x12" + bytes([len(final_body)]) + final_body
    decoded = decode_response(unpacked)
    assert isinstance(decoded, inference_pb2.GenerateResponse)
    assert list(decoded.final.prompt_token_ids) == [5, 6]
    # the same ids packed twice (also legal: a parser concatenates them) are not spliced either
    twice = b"\x0a\x01\x05\x0a\x01\x06"
    decoded = decode_response(b"\x12" + bytes([len(twice)]) + twice)
    assert isinstance(decoded, inference_pb2.GenerateResponse)
    assert list(decoded.final.prompt_token_ids) == [5, 6]


def test_frame_len_field_uses_multi_byte_lengths() -> None:
    payload = bytes(range(128)) * 3
    record = common_pb2.CallRecord.FromString(frame_len_field(RECORD_PROMPT_IDS, payload))
    assert len(record.prompt_token_ids) > 0
    assert frame_len_field(RECORD_PROMPT_IDS, payload)[:3] == b"\x42\x80\x03"
