"""The engine model's device KV cache across KV-cache groups.

One `BlockPool` per group, each with its own block size. A request's prefix hit is
what every group holds, aligned to every group's block size; allocation for a
request is all-or-nothing across groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvoffload.engine_model.block_pool import BlockPool
from kvoffload.engine_model.request import SimRequest

BlockTable = tuple[tuple[int, ...], ...]


class DeviceCache:
    """Paged blocks with prefix caching for every group of the modeled engine."""

    def __init__(
        self, tokens_per_block: Sequence[int], device_blocks: int | None
    ) -> None:
        self.tokens_per_block = tuple(tokens_per_block)
        self.pools = [BlockPool(device_blocks) for _ in self.tokens_per_block]
        self.alignment = math.lcm(*self.tokens_per_block)

    def _group_hashes(self, req: SimRequest, group: int) -> list[bytes]:
        step = self.tokens_per_block[group] // req.hash_block_tokens
        limit = req.num_tokens // req.hash_block_tokens
        return [req.hashes[(j + 1) * step - 1] for j in range(limit // step)]

    def prefix_hit(self, req: SimRequest) -> tuple[list[list[int]], int]:
        """Cached blocks per group and the tokens they cover (never the last token)."""
        per_group = [
            pool.cached_prefix(self._group_hashes(req, g))
            for g, pool in enumerate(self.pools)
        ]
        hit = min(
            len(b) * t for b, t in zip(per_group, self.tokens_per_block, strict=True)
        )
        hit = min(hit, req.num_tokens - 1) // self.alignment * self.alignment
        blocks = [
            b[: hit // t] for b, t in zip(per_group, self.tokens_per_block, strict=True)
        ]
        return blocks, hit

    def blocks_needed(self, tables: Sequence[Sequence[int]], tokens: int) -> list[int]:
        return [
            max(0, math.ceil(tokens / t) - len(ids))
            for t, ids in zip(self.tokens_per_block, tables, strict=True)
        ]

    def can_hold(self, tokens: int) -> bool:
        """Whether the whole device, empty, holds `tokens` tokens of one request."""
        return all(
            pool.num_blocks is None or math.ceil(tokens / t) <= pool.num_blocks
            for pool, t in zip(self.pools, self.tokens_per_block, strict=True)
        )

    def fits(
        self, needed: Sequence[int], acquiring: Sequence[Sequence[int]] = ()
    ) -> bool:
        """Whether `needed` fresh blocks per group are free (after acquiring a hit)."""
        held = acquiring or [[] for _ in self.pools]
        return all(
            n <= pool.num_free_after_acquire(blocks)
            for n, pool, blocks in zip(needed, self.pools, held, strict=True)
        )

    def admit(self, req: SimRequest, hit_blocks: list[list[int]], tokens: int) -> bool:
        """Give `req` its hit blocks plus fresh ones up to `tokens`; False if no room."""
        needed = self.blocks_needed(hit_blocks, tokens)
        if not self.fits(needed, hit_blocks):
            return False
        req.block_ids = []
        for pool, blocks, n in zip(self.pools, hit_blocks, needed, strict=True):
            pool.acquire(blocks)
            fresh = pool.allocate(n)
            assert fresh is not None
            req.block_ids.append(blocks + fresh)
        return True

    def grow(self, req: SimRequest, tokens: int) -> BlockTable | None:
        """Append blocks so `req` holds `tokens`; None (and nothing taken) if no room."""
        needed = self.blocks_needed(req.block_ids, tokens)
        if not self.fits(needed):
            return None
        new: list[tuple[int, ...]] = []
        for pool, ids, n in zip(self.pools, req.block_ids, needed, strict=True):
            fresh = pool.allocate(n)
            assert fresh is not None
            ids.extend(fresh)
            new.append(tuple(fresh))
        return tuple(new)

    def register(self, req: SimRequest, computed_before: int) -> None:
        """Cache the blocks `req` filled since it had `computed_before` tokens."""
        for t, pool, ids in zip(
            self.tokens_per_block, self.pools, req.block_ids, strict=False
        ):
            step = t // req.hash_block_tokens
            end = min(req.num_computed // t, len(ids), len(req.hashes) // step)
            for j in range(computed_before // t, end):
                pool.register(ids[j], req.hashes[(j + 1) * step - 1])

    def release(self, req: SimRequest) -> None:
        for pool, ids in zip(self.pools, req.block_ids, strict=False):
            pool.release(ids)
        req.block_ids = []
