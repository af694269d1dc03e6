"""The offline optimum for a chunk cache: Belady's MIN with bypass, from the future.

Requests are taken in arrival order; a request's hit is the leading run of its
chunks found in the cache. Then its resident chunks are refreshed (they are used
now) and its other chunks inserted, tail first (as the online policies see a
request: head last): on a miss with the cache full, the chunk needed furthest
away is evicted, or the insert is skipped if the new chunk is needed further
still. "Further" orders by the next request holding the chunk, then by its
position in that request: a hit is a leading run, so of two chunks next needed
by the same request the deeper one is worth less (without this, a cache full of
a prompt's tail bypasses its head and none of it ever hits). For keys that chain
their prefix, as block hashes do, it is the upper bound no online policy of the
same capacity beats at chunk level.
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


NextUse = tuple[float, int]
"""When a chunk is next needed: (index of the next request holding it, its position
there); `NEVER` if no later request holds it. Larger is further away."""

NEVER: NextUse = (math.inf, 0)


def _next_uses(requests: Sequence[Sequence[Hashable]]) -> list[list[NextUse]]:
    """For each request and chunk, when that chunk is next needed."""
    last_seen: dict[Hashable, NextUse] = {}
    out: list[list[NextUse]] = [[] for _ in requests]
    for i in range(len(requests) - 1, -1, -1):
        out[i] = [last_seen.get(key, NEVER) for key in requests[i]]
        # A key held twice is needed from its first position.
        for pos in range(len(requests[i]) - 1, -1, -1):
            last_seen[requests[i][pos]] = (float(i), pos)
    return out


def _furthest(
    heap: list[tuple[NextUse, int, Hashable]], cache: dict[Hashable, NextUse]
) -> tuple[Hashable, NextUse]:
    """The cached chunk needed furthest away, left on top of `heap` (stale entries
    above it, of chunks since refreshed or evicted, are dropped)."""
    while True:
        (neg_at, neg_pos), _, key = heap[0]
        use = (-neg_at, -neg_pos)
        if cache.get(key) == use:
            return key, use
        heapq.heappop(heap)


def belady(requests: Sequence[Sequence[Hashable]], capacity: int) -> OfflineResult:
    """Hit chunks of Belady's MIN (with bypass) at `capacity` chunks."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity!r}")
    next_uses = _next_uses(requests)
    cache: dict[Hashable, NextUse] = {}
    # (negated next use, tiebreak, key): a max-heap on next use; entries go stale
    # when their key is refreshed or evicted, and are dropped when they surface.
    heap: list[tuple[NextUse, int, Hashable]] = []
    tiebreak = 0
    hits = total = 0
    for keys, uses in zip(requests, next_uses, strict=True):
        total += len(keys)
        for key in keys:
            if key not in cache:
                break
            hits += 1
        # The request's resident chunks are used now: their next use moves on
        # before any of its misses is weighed against them.
        for key, use in zip(keys, uses, strict=True):
            if key in cache:
                cache[key] = use
                tiebreak += 1
                heapq.heappush(heap, ((-use[0], -use[1]), tiebreak, key))
        for key, use in zip(reversed(keys), reversed(uses), strict=True):
            if key in cache:
                continue
            if len(cache) >= capacity:
                victim, furthest = _furthest(heap, cache)
                if use >= furthest:
                    continue  # bypass: the newcomer is needed no sooner
                heapq.heappop(heap)
                del cache[victim]
            cache[key] = use
            tiebreak += 1
            heapq.heappush(heap, ((-use[0], -use[1]), tiebreak, key))
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
