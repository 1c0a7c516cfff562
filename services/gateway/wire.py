"""Protobuf wire-format splicing for the capture's critical path (no I/O, no grpc).

The final of a generation carries the ~20K prompt ids, and the CallRecord stores them again. Instead of
re-encoding them (about 0.2 ms of the response's critical path for a Claude-Code-sized prompt), the
gateway keeps the packed bytes exactly as inference sent them and frames them as the CallRecord's field:
protobuf parses concatenated messages as one, so `framed + rest.SerializeToString()` is the serialization
of the record with those ids. Anything unexpected (an unpacked encoding, a repeated field, a malformed
buffer) yields None and the caller serializes normally.
"""

from __future__ import annotations

from dataclasses import dataclass

from lodestar.v1 import inference_pb2

_LEN = 2
_FINAL = 2  # GenerateResponse.final
_PROMPT_IDS = 1  # GenerateFinal.prompt_token_ids
RECORD_PROMPT_IDS = 8  # CallRecord.prompt_token_ids


@dataclass(frozen=True, slots=True)
class WireFinal:
    """A final response together with its prompt ids' packed bytes as received."""

    response: inference_pb2.GenerateResponse
    packed_prompt_ids: bytes


def decode_response(data: bytes) -> inference_pb2.GenerateResponse | WireFinal:
    """A Generate stream message; a final comes with its packed prompt ids when they are in plain form."""
    response = inference_pb2.GenerateResponse.FromString(data)
    if response.WhichOneof("event") != "final":
        return response
    packed = nested_packed_field(data, _FINAL, _PROMPT_IDS)
    return response if packed is None else WireFinal(response, packed)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _only_len_field(data: bytes, start: int, end: int, number: int) -> tuple[int, int] | None:
    """The payload span of field `number` in `data[start:end]` when it occurs exactly once, length-delimited."""
    found: tuple[int, int] | None = None
    pos = start
    while pos < end:
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
            span = None
        elif wire == _LEN:
            size, pos = _varint(data, pos)
            span = (pos, pos + size)
            pos += size
        elif wire == 1:
            pos += 8
            span = None
        elif wire == 5:
            pos += 4
            span = None
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if field == number:
            if found is not None or span is None:
                raise ValueError("field repeated or not length-delimited")
            found = span
    if pos != end:
        raise ValueError("truncated message")
    return found


def nested_packed_field(data: bytes, outer: int, inner: int) -> bytes | None:
    """The packed payload of field `inner` inside the message in field `outer` of `data` (None when absent or
    not in the plain packed form)."""
    try:
        outer_span = _only_len_field(data, 0, len(data), outer)
        if outer_span is None:
            return None
        inner_span = _only_len_field(data, outer_span[0], outer_span[1], inner)
    except (ValueError, IndexError):
        return None
    return None if inner_span is None else data[inner_span[0] : inner_span[1]]


def frame_len_field(number: int, payload: bytes) -> bytes:
    """`payload` encoded as length-delimited field `number`."""
    out = bytearray()
    for value in ((number << 3) | _LEN, len(payload)):
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out) + payload
