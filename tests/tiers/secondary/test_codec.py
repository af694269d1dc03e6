"""The chunk format: a round trip, and every check that rejects a chunk."""

from __future__ import annotations

import struct
import zlib

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
    assert header[:4] == (key(1), FP, len(PAYLOAD), codec.payload_checksum([PAYLOAD]))
    assert header.hint_until is None and header.size == codec.header_size(
        len(key(1)), FP
    )


def test_a_retention_hint_round_trips_in_unix_seconds() -> None:
    payload = b"x" * 8
    crc = codec.payload_checksum([payload])
    held = codec.decode_header(codec.encode_header(key(1), FP, 8, crc, 60.0, 1000.0))
    assert held.hint_until == 1060.0
    assert held.hint_left(1030.0) == 30.0 and held.hint_left(1060.0) is None
    done = codec.decode_header(codec.encode_header(key(1), FP, 8, crc, 0.0, 1000.0))
    assert done.hint_left(1e9) == 0.0
    none = codec.decode_header(codec.encode_header(key(1), FP, 8, crc, None, 1000.0))
    assert none.hint_left(0.0) is None


def encoded_v1(k: bytes = key(1), fp: str = FP, payload: bytes = PAYLOAD) -> bytes:
    """A chunk as format 1 wrote it (before retention hints)."""
    fixed = struct.Struct("<4sHHHHQI")
    crc = codec.payload_checksum([payload])
    head = (
        fixed.pack(b"KVOC", 1, 0, len(k), len(fp), len(payload), crc) + k + fp.encode()
    )
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def test_a_chunk_of_format_1_still_loads_unhinted() -> None:
    data = encoded_v1()
    header = codec.decode_header(data)
    codec.check_header(header, key(1), FP, len(PAYLOAD))
    codec.check_payload(header, [memoryview(data)[header.size :]])
    assert header.hint_until is None
    assert header.size == len(data) - len(PAYLOAD)


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
    data[4] = max(codec.READABLE_VERSIONS) + 1
    with pytest.raises(CorruptChunkError, match="format version"):
        codec.decode_header(bytes(data))


def test_a_payload_in_parts_checks_as_the_joined_bytes() -> None:
    parts = [PAYLOAD[:100], memoryview(PAYLOAD)[100:700], PAYLOAD[700:]]
    assert codec.payload_checksum(parts) == codec.payload_checksum([PAYLOAD])
    header = codec.decode_header(encoded())
    codec.check_payload(header, parts)
    with pytest.raises(codec.CorruptChunkError, match="checksum"):
        codec.check_payload(header, [PAYLOAD[700:], PAYLOAD[:700]])


def with_deadline(until: float) -> bytes:
    """A format-2 header holding the deadline `until` (flags: held), its own
    checksum recomputed: what a faulty writer, not a flipped bit, would leave."""
    head = bytearray(codec.encode_header(key(1), FP, 8, 0, 60.0, 1000.0))
    fixed = struct.Struct("<4sHHHHQId")
    fields = list(fixed.unpack_from(head))
    fields[7] = until
    fixed.pack_into(head, 0, *fields)
    end = fixed.size + len(key(1)) + len(FP)
    struct.pack_into("<I", head, end, zlib.crc32(head[:end]))
    return bytes(head)


@pytest.mark.parametrize(
    "until", [float("inf"), float("-inf"), float("nan"), -5.0, 0.0, -0.0]
)
def test_a_deadline_that_is_no_time_reads_as_no_hint(until: float) -> None:
    """A deadline that is not a finite Unix time in the future (with a valid
    checksum) is no hint: the chunk loads unhinted, never held forever."""
    header = codec.decode_header(with_deadline(until))
    assert header.hint_left(2000.0) is None


def test_a_hint_that_is_no_number_is_not_written() -> None:
    for hint in (float("inf"), float("nan"), -1.0):
        header = codec.decode_header(codec.encode_header(key(1), FP, 8, 0, hint, 1.0))
        assert header.hint_until is None
