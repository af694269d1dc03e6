"""Offload keys: the identity of a chunk in every tier.

A key is the chained prefix hash of the chunk's last engine block followed by the
KV-cache group index as 4 big-endian bytes. It is a plain `bytes` object: cheaper
to hash than a tuple and not tracked by the garbage collector.
"""

from __future__ import annotations

from typing import NewType

OffloadKey = NewType("OffloadKey", bytes)

GROUP_INDEX_BYTES = 4
_MAX_GROUP = (1 << (8 * GROUP_INDEX_BYTES)) - 1


def make_offload_key(block_hash: bytes, group: int) -> OffloadKey:
    """Pack a block hash and a KV-cache group index into an `OffloadKey`."""
    if not 0 <= group <= _MAX_GROUP:
        raise ValueError(f"group must be in [0, {_MAX_GROUP}], got {group!r}")
    return OffloadKey(bytes(block_hash) + group.to_bytes(GROUP_INDEX_BYTES, "big"))


def offload_key_block_hash(key: OffloadKey) -> bytes:
    """The block hash part of `key`."""
    return key[:-GROUP_INDEX_BYTES]


def offload_key_group(key: OffloadKey) -> int:
    """The KV-cache group index of `key`."""
    return int.from_bytes(key[-GROUP_INDEX_BYTES:], "big")


def chunk_keys(
    block_hashes: list[bytes], blocks_per_chunk: int, group: int
) -> list[OffloadKey]:
    """Keys of the whole chunks covered by `block_hashes`.

    A chunk spans `blocks_per_chunk` consecutive engine blocks and takes the hash
    of its last block, which (hashes being chained) covers the whole prefix. A
    trailing partial chunk gets no key.
    """
    if blocks_per_chunk < 1:
        raise ValueError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk!r}")
    suffix = group.to_bytes(GROUP_INDEX_BYTES, "big")
    return [
        OffloadKey(block_hashes[i] + suffix)
        for i in range(blocks_per_chunk - 1, len(block_hashes), blocks_per_chunk)
    ]
