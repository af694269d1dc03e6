"""The engine model's paged device cache for one KV-cache group, with prefix caching.

Blocks hold `tokens_per_block` tokens. A full, computed block is registered under
its chained hash; once no request uses it, it stays cached (evictable, least
recently freed first) until its memory is needed. `num_blocks=None` models a device
with unlimited memory and no prefix cache (replay's `--device-tokens 0`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class BlockPool:
    """Allocation, reference counts and the prefix cache of one group's blocks."""

    def __init__(self, num_blocks: int | None) -> None:
        if num_blocks is not None and num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1 or None, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.caching = num_blocks is not None
        self._next_fresh = 0
        self._free: OrderedDict[int, None] = OrderedDict()
        self._refs: dict[int, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}

    def num_free(self) -> int:
        if self.num_blocks is None:
            return 1 << 62
        return len(self._free) + self.num_blocks - self._next_fresh

    def num_free_after_acquire(self, blocks: Sequence[int]) -> int:
        """Free blocks left once `blocks` (a cached prefix) are acquired."""
        return self.num_free() - sum(1 for block in blocks if block in self._free)

    def cached_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """Blocks holding the longest cached prefix of `hashes`."""
        if not self.caching:
            return []
        out: list[int] = []
        block_of = self._block_of
        for h in hashes:
            block = block_of.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def acquire(self, blocks: Iterable[int]) -> None:
        """Take references on cached blocks (a prefix hit)."""
        for block in blocks:
            self._free.pop(block, None)
            self._refs[block] = self._refs.get(block, 0) + 1

    def allocate(self, n: int) -> list[int] | None:
        """`n` fresh blocks, in vLLM's order: freed blocks that cache nothing
        first (the last freed first), then never-used ones, then cached ones,
        evicting them least recently freed first."""
        if n > self.num_free():
            return None
        out: list[int] = []
        free = self._free
        while len(out) < n:
            if free and next(iter(free)) not in self._hash_of:
                block, _ = free.popitem(last=False)
            elif self.num_blocks is None or self._next_fresh < self.num_blocks:
                block = self._next_fresh
                self._next_fresh += 1
            else:
                block, _ = free.popitem(last=False)
                old = self._hash_of.pop(block, None)
                if old is not None and self._block_of.get(old) == block:
                    del self._block_of[old]
            self._refs[block] = 1
            out.append(block)
        return out

    def register(self, block: int, block_hash: bytes) -> None:
        """`block` now holds the computed KV of the full block `block_hash`."""
        if not self.caching or block in self._hash_of:
            return
        if block_hash in self._block_of:
            return  # another block already caches this prefix
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block

    def forget(self, block: int) -> None:
        """`block` no longer holds valid KV (a failed load)."""
        h = self._hash_of.pop(block, None)
        if h is not None and self._block_of.get(h) == block:
            del self._block_of[h]

    def release(self, blocks: Sequence[int]) -> None:
        """Drop references; blocks nobody uses become free, tail first so that a
        request's head stays cached longest."""
        for block in reversed(blocks):
            count = self._refs.get(block, 0) - 1
            if count > 0:
                self._refs[block] = count
                continue
            self._refs.pop(block, None)
            if not self.caching:
                continue
            if block in self._hash_of:
                self._free[block] = None
            else:
                self._free[block] = None
                self._free.move_to_end(block, last=False)  # uncached: reuse first
