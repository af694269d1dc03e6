"""The self-describing chunk format shared by the file and Redis tiers.

A stored chunk is a header followed by the raw payload (the chunk's bytes as they
sit in a host slot). The header names the format version, the key, the model and
layout fingerprint, the payload length and a checksum of the payload, and carries
its own checksum. Any mismatch makes the chunk unusable: it is a miss, never
loaded. Format 2 adds the chunk's retention hint (docs/policies.md, "Retention
hints"): until when, in Unix seconds, a request is expected to ask for it, or
that none will; a reader that sees format 1 (written before hints) takes it as
unhinted, so chunks of the old format still load.

The checksum is CRC-32 (zlib's polynomial): it catches what happens to a chunk at
rest or on the wire (flipped bits, torn or truncated writes) and is computed by
ISA-L when the optional `isal` package is installed (about 14 GB/s per core, the
same values), else by `zlib.crc32` (about 3 GB/s). Either releases the GIL, so I/O
threads checksum in parallel. It does not resist tampering; BLAKE2b would, at
under 1 GB/s per core: slower than the disks the file tier is for.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from kvoffload.keys import OffloadKey

try:  # ISA-L's CRC-32: the same values as zlib's, several times faster
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - depends on the environment
    from zlib import crc32 as _crc32

MAGIC = b"KVOC"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

# magic, version, flags, key length, fingerprint length, payload length, payload crc
_FIXED_V1 = struct.Struct("<4sHHHHQI")
# ... then (format 2) the hint's deadline in Unix seconds (see the flags)
_FIXED = struct.Struct("<4sHHHHQId")
_CRC = struct.Struct("<I")
FLAG_RETAIN = 1
"""The chunk is held until the deadline."""
FLAG_DONE = 2
"""Its request said no request will ask for it (a hint of 0)."""
_FINGERPRINT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class CorruptChunkError(ValueError):
    """A stored chunk failed a check; the message says which."""


class ChunkHeader(NamedTuple):
    key: OffloadKey
    fingerprint: str
    payload_len: int
    payload_crc: int
    hint_until: float | None = None
    """Until when (Unix seconds) a request is expected, 0.0 for "none will",
    `None` for no hint."""
    size: int = 0
    """Bytes of the header: where the payload starts in a value."""

    def hint_left(self, now: float) -> float | None:
        """The hint as a request gives one, at Unix time `now`: seconds left
        (> 0), 0, or `None` (none, or expired)."""
        until = self.hint_until
        if until is None or until == 0.0:
            return until
        left = until - now
        return left if 0 < left < math.inf else None


def validate_fingerprint(fingerprint: object) -> str:
    """`fingerprint` if it is usable as a directory and key namespace."""
    if not isinstance(fingerprint, str) or not _FINGERPRINT_RE.match(fingerprint):
        raise ValueError(
            f"fingerprint: {fingerprint!r} is not allowed; expected 1-64 characters "
            "from A-Z a-z 0-9 . _ - (see make_fingerprint)"
        )
    return fingerprint


def make_fingerprint(fields: Mapping[str, object]) -> str:
    """A stable 32-hex-digit fingerprint of everything that shapes a chunk's bytes.

    Pass the model (name and revision), dtype, layer and head layout, tokens per
    engine block, blocks per chunk, KV-cache groups, tensor-parallel rank and size,
    and the block hash algorithm: chunks are shared only between identical ones.
    """
    canonical = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def header_size(key_len: int, fingerprint: str) -> int:
    """Bytes of the header for a key of `key_len` bytes."""
    return _FIXED.size + key_len + len(fingerprint) + _CRC.size


def payload_checksum(parts: Sequence[bytes | memoryview]) -> int:
    """CRC-32 of the parts' bytes taken in order, as if joined."""
    crc = 0
    for part in parts:
        crc = _crc32(part, crc)
    return crc


def encode_header(
    key: OffloadKey,
    fingerprint: str,
    payload_len: int,
    payload_crc: int,
    hint: float | None = None,
    now: float = 0.0,
) -> bytes:
    """A format-2 header; `hint` is the chunk's retention hint as a request gives
    one (seconds from Unix time `now`, 0, or `None`)."""
    flags, until = 0, 0.0
    if hint is not None and hint > 0 and now + hint < math.inf:
        flags, until = FLAG_RETAIN, now + hint
    elif hint == 0:
        flags = FLAG_DONE
    return _pack(key, fingerprint, payload_len, payload_crc, flags, until)


def _pack(
    key: OffloadKey,
    fingerprint: str,
    payload_len: int,
    payload_crc: int,
    flags: int,
    until: float,
) -> bytes:
    fp = fingerprint.encode("ascii")
    fixed = _FIXED.pack(
        MAGIC, FORMAT_VERSION, flags, len(key), len(fp), payload_len, payload_crc, until
    )
    head = fixed + key + fp
    return head + _CRC.pack(zlib.crc32(head))


def renew_header(
    data: bytes | memoryview, until: float
) -> tuple[ChunkHeader, bytes] | None:
    """The header at the start of `data` and, if it is of format 2, the same
    header held until `until` (Unix seconds): equal to it but for the flags,
    the deadline and the header's own checksum, so of the same size and
    describing the same payload (its checksum is kept). `None` for a header
    of format 1 (no room for a deadline) or an `until` that is no deadline.
    Raises `CorruptChunkError` for a header failing its checks: nothing to
    renew, never a header to heal."""
    header = decode_header(data)
    if not 0 < until < math.inf:
        return None
    renewed = _pack(
        header.key,
        header.fingerprint,
        header.payload_len,
        header.payload_crc,
        FLAG_RETAIN,
        until,
    )
    # A format-1 header is shorter: the renewed one would overwrite payload.
    return (header, renewed) if len(renewed) == header.size else None


def decode_header(data: bytes | memoryview) -> ChunkHeader:
    """Parse and self-check a header (format 1 or 2) at the start of `data`."""
    if len(data) < _FIXED_V1.size:
        raise CorruptChunkError(f"header truncated ({len(data)} bytes)")
    magic, version, flags, key_len, fp_len, payload_len, payload_crc = (
        _FIXED_V1.unpack_from(data)
    )
    if magic != MAGIC:
        raise CorruptChunkError(f"bad magic {bytes(magic)!r}")
    if version not in READABLE_VERSIONS:
        raise CorruptChunkError(
            f"format version {version}, expected one of {READABLE_VERSIONS}"
        )
    fixed = _FIXED if version == 2 else _FIXED_V1
    end = fixed.size + key_len + fp_len
    if len(data) < end + _CRC.size:
        raise CorruptChunkError("header truncated")
    (stored_crc,) = _CRC.unpack_from(data, end)
    if zlib.crc32(data[:end]) != stored_crc:
        raise CorruptChunkError("header checksum mismatch")
    key = OffloadKey(bytes(data[fixed.size : fixed.size + key_len]))
    try:
        fingerprint = bytes(data[fixed.size + key_len : end]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise CorruptChunkError("fingerprint is not ASCII") from exc
    hint_until: float | None = None
    if version == 2 and flags & FLAG_DONE:
        hint_until = 0.0
    elif version == 2 and flags & FLAG_RETAIN:
        until = _FIXED.unpack_from(data)[7]
        # A checksum guards against flipped bits, not a faulty writer: a
        # deadline that is no time after the epoch (NaN, inf, <= 0) is no hint.
        hint_until = until if 0 < until < math.inf else None
    return ChunkHeader(
        key, fingerprint, payload_len, payload_crc, hint_until, end + _CRC.size
    )


def check_header(
    header: ChunkHeader, key: OffloadKey, fingerprint: str, payload_len: int
) -> None:
    """Raise `CorruptChunkError` unless the header describes exactly this chunk."""
    if header.key != key:
        raise CorruptChunkError(f"key {header.key.hex()} where {key.hex()} expected")
    if header.fingerprint != fingerprint:
        raise CorruptChunkError(
            f"fingerprint {header.fingerprint!r}, expected {fingerprint!r}"
        )
    if header.payload_len != payload_len:
        raise CorruptChunkError(
            f"payload of {header.payload_len} bytes, expected {payload_len}"
        )


def check_payload(header: ChunkHeader, parts: Sequence[bytes | memoryview]) -> None:
    """The payload, the parts' bytes taken in order, matches the header."""
    size = sum(len(part) for part in parts)
    if size != header.payload_len:
        raise CorruptChunkError(
            f"payload truncated: {size} of {header.payload_len} bytes"
        )
    if payload_checksum(parts) != header.payload_crc:
        raise CorruptChunkError("payload checksum mismatch")
