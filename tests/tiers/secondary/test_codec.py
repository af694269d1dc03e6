"""The chunk format: a round trip, and every check that rejects a chunk."""

from __future__ import annotations

import pytest

from kvoffload.tiers.secondary import CorruptChunkError, codec
from tests.tiers.secondary.secondary_support import key

FP = "model-a"
PAYLOAD = bytes(range(256)) * 4


def encoded(k: bytes = key(1), fp: str = FP, payload: bytes = PAYLOAD) -> bytes:
    header = codec.encode_header(k, fp, len(payload), codec.payload_checksum([payload]))  # type: ignore[arg-type]
    return header + payload


def test_round_trip() -> None:
    data = encoded()
    header = codec.decode_header(data)
    codec.check_header(header, key(1), FP, len(PAYLOAD))
    codec.check_payload(
        header, [memoryview(data)[codec.header_size(len(key(1)), FP) :]]
    )
    assert header == (key(1), FP, len(PAYLOAD), codec.payload_checksum([PAYLOAD]))


def flip(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x01
    return bytes(out)


@pytest.mark.parametrize("offset", [0, 4, 10, 20, 30, 60])
def test_any_flipped_header_byte_is_detected(offset: int) -> None:
    with pytest.raises(CorruptChunkError):
        codec.decode_header(flip(encoded(), offset))


def test_payload_flip_and_truncation_are_detected() -> None:
    data = encoded()
    start = codec.header_size(len(key(1)), FP)
    header = codec.decode_header(data)
    with pytest.raises(CorruptChunkError, match="checksum"):
        codec.check_payload(header, [flip(data, start + 5)[start:]])
    with pytest.raises(CorruptChunkError, match="truncated"):
        codec.check_payload(header, [data[start:-1]])
    with pytest.raises(CorruptChunkError, match="truncated"):
        codec.decode_header(data[:10])


def test_header_for_another_key_fingerprint_or_length_is_rejected() -> None:
    header = codec.decode_header(encoded())
    with pytest.raises(CorruptChunkError, match="key"):
        codec.check_header(header, key(2), FP, len(PAYLOAD))
    with pytest.raises(CorruptChunkError, match="fingerprint"):
        codec.check_header(header, key(1), "model-b", len(PAYLOAD))
    with pytest.raises(CorruptChunkError, match="payload of"):
        codec.check_header(header, key(1), FP, len(PAYLOAD) - 1)


def test_other_format_version_is_rejected() -> None:
    data = bytearray(encoded())
    data[4] = codec.FORMAT_VERSION + 1
    with pytest.raises(CorruptChunkError, match="format version"):
        codec.decode_header(bytes(data))


def test_a_payload_in_parts_checks_as_the_joined_bytes() -> None:
    parts = [PAYLOAD[:100], memoryview(PAYLOAD)[100:700], PAYLOAD[700:]]
    assert codec.payload_checksum(parts) == codec.payload_checksum([PAYLOAD])
    header = codec.decode_header(encoded())
    codec.check_payload(header, parts)
    with pytest.raises(codec.CorruptChunkError, match="checksum"):
        codec.check_payload(header, [PAYLOAD[700:], PAYLOAD[:700]])
