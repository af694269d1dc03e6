"""The offline optimum for a chunk cache: Belady's MIN with bypass, from the future.

Requests are taken in arrival order; a request's hit is the leading run of its
chunks found in the cache. Then each of its chunks is inserted or refreshed, tail
first (as the online policies see a request: head last): on a miss with the cache full, the chunk whose next use is furthest away is evicted, or
the insert is skipped if the new chunk's own next use is further still. It is the
upper bound no online policy of the same capacity can beat at chunk level.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence
from typing import NamedTuple


class OfflineResult(NamedTuple):
    hit_chunks: int
    prompt_chunks: int

    @property
    def hit_ratio(self) -> float:
        return self.hit_chunks / self.prompt_chunks if self.prompt_chunks else 0.0


def _next_uses(requests: Sequence[Sequence[Hashable]]) -> list[list[float]]:
    """For each request and chunk, the index of the next request holding that chunk."""
    last_seen: dict[Hashable, int] = {}
    out: list[list[float]] = [[] for _ in requests]
    for i in range(len(requests) - 1, -1, -1):
        uses: list[float] = []
        for key in requests[i]:
            uses.append(float(last_seen.get(key, math.inf)))
        for key in requests[i]:
            last_seen[key] = i
        out[i] = uses
    return out


def belady(requests: Sequence[Sequence[Hashable]], capacity: int) -> OfflineResult:
    """Hit chunks of Belady's MIN (with bypass) at `capacity` chunks."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity!r}")
    next_uses = _next_uses(requests)
    cache: dict[Hashable, float] = {}
    heap: list[tuple[float, int, Hashable]] = []  # (-next use, tiebreak, key), lazy
    tiebreak = 0
    hits = total = 0
    for keys, uses in zip(requests, next_uses, strict=True):
        total += len(keys)
        for key in keys:
            if key not in cache:
                break
            hits += 1
        for key, use in zip(reversed(keys), reversed(uses), strict=True):
            if key not in cache and len(cache) >= capacity:
                while True:
                    neg, _, victim = heap[0]
                    if cache.get(victim) == -neg:
                        break
                    heapq.heappop(heap)
                if use >= -neg:
                    continue  # bypass: the newcomer is needed even later
                heapq.heappop(heap)
                del cache[victim]
            cache[key] = use
            tiebreak += 1
            heapq.heappush(heap, (-use, tiebreak, key))
    return OfflineResult(hits, total)


def infinite(requests: Sequence[Sequence[Hashable]]) -> OfflineResult:
    """Hit chunks with unlimited capacity: every chunk seen before hits."""
    seen: set[Hashable] = set()
    hits = total = 0
    for keys in requests:
        total += len(keys)
        for key in keys:
            if key not in seen:
                break
            hits += 1
        seen.update(keys)
    return OfflineResult(hits, total)
