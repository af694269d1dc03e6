"""Keys and hashing: how chunks are named in every tier."""

from kvoffload.keys.base import (
    GROUP_INDEX_BYTES,
    OffloadKey,
    chunk_keys,
    make_offload_key,
    offload_key_block_hash,
    offload_key_group,
)
from kvoffload.keys.hashing import HASH_ALGORITHMS, BlockHasher, HashAlgorithm, HashRoot

__all__ = [
    "GROUP_INDEX_BYTES",
    "HASH_ALGORITHMS",
    "BlockHasher",
    "HashAlgorithm",
    "HashRoot",
    "OffloadKey",
    "chunk_keys",
    "make_offload_key",
    "offload_key_block_hash",
    "offload_key_group",
]
