"""Chained hashing of token blocks.

hash(block i) covers hash(block i-1), the block's token ids and its extra keys, so
equal hashes mean equal prefixes. The root of every chain covers the model
fingerprint, the LoRA adapter's identity (name, path and a digest of its files,
where the engine integration can read them) and the request's `cache_salt`: requests of different
tenants (salts) or models never share a hash. The default algorithm is SHA-256
over a canonical byte encoding, identical across processes, restarts and machines.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

HashAlgorithm = Literal["sha256", "fast"]
HASH_ALGORITHMS: tuple[HashAlgorithm, ...] = ("sha256", "fast")

_DOMAIN = b"kvoffload/v1"


def _encode_str(value: str | None) -> bytes:
    """Length-prefixed UTF-8; `None` and "" encode differently."""
    if value is None:
        return b"\xff\xff\xff\xff"
    raw = value.encode("utf-8")
    return struct.pack(">I", len(raw)) + raw


def _encode_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian signed 64-bit integers, whatever the host."""
    arr = array("q", token_ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return struct.pack(">I", len(arr)) + arr.tobytes()


@dataclass(frozen=True)
class HashRoot:
    """What every block of one request's chain depends on besides its tokens."""

    model: str = ""
    lora: str | None = None
    cache_salt: str | None = None

    def encode(self) -> bytes:
        return (
            _DOMAIN
            + _encode_str(self.model)
            + _encode_str(self.lora)
            + _encode_str(self.cache_salt)
        )


class BlockHasher:
    """Hashes a request's tokens into one chained hash per full engine block.

    `algorithm="sha256"` (default) gives 32-byte hashes that are stable across
    processes and machines, as shared tiers need. `algorithm="fast"` uses Python's
    built-in tuple hash: quicker, 8 bytes, valid within one process only (and not
    collision resistant), for single-process simulation.
    """

    def __init__(self, tokens_per_block: int, algorithm: HashAlgorithm = "sha256"):
        if tokens_per_block < 1:
            raise ValueError(f"tokens_per_block must be >= 1, got {tokens_per_block!r}")
        if algorithm not in HASH_ALGORITHMS:
            raise ValueError(
                f"algorithm must be one of {HASH_ALGORITHMS}, got {algorithm!r}"
            )
        self.tokens_per_block = tokens_per_block
        self.algorithm: HashAlgorithm = algorithm

    def root_hash(self, root: HashRoot) -> bytes:
        encoded = root.encode()
        if self.algorithm == "sha256":
            return hashlib.sha256(encoded).digest()
        return hash(encoded).to_bytes(8, "big", signed=True)

    def hash_blocks(
        self,
        token_ids: Sequence[int],
        root: HashRoot = HashRoot(),
        *,
        parent: bytes | None = None,
        start_block: int = 0,
        extra_keys: Sequence[Sequence[str]] | None = None,
    ) -> list[bytes]:
        """Hashes of the full blocks of `token_ids` from `start_block` on.

        `parent` is the hash of block `start_block - 1` (required when
        `start_block > 0`), so a growing request hashes only its new blocks.
        `extra_keys[i]` (multimodal hashes and the like) enter block
        `start_block + i`.
        """
        if start_block > 0 and parent is None:
            raise ValueError("parent hash is required when start_block > 0")
        prev = parent if parent is not None else self.root_hash(root)
        size = self.tokens_per_block
        out: list[bytes] = []
        num_full = len(token_ids) // size
        for i, block in enumerate(range(start_block, num_full)):
            tokens = token_ids[block * size : (block + 1) * size]
            extras = (
                extra_keys[i] if extra_keys is not None and i < len(extra_keys) else ()
            )
            prev = self._hash_one(prev, tokens, extras)
            out.append(prev)
        return out

    def _hash_one(
        self, parent: bytes, tokens: Sequence[int], extras: Sequence[str]
    ) -> bytes:
        if self.algorithm == "fast":
            return hash((parent, tuple(tokens), tuple(extras))).to_bytes(
                8, "big", signed=True
            )
        h = hashlib.sha256(parent)
        h.update(_encode_tokens(tokens))
        h.update(struct.pack(">I", len(extras)))
        for extra in extras:
            h.update(_encode_str(extra))
        return h.digest()
