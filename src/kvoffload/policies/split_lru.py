"""Split LRU: chunks seen by one request and reused chunks, in two LRU segments
whose split follows the hit rates their ghosts show.

Most prefix chunks of a chat trace are seen once; those a second request reuses are
likely to be reused again. The policy keeps the two kinds apart and learns online
how much room each deserves (`SplitController`), remembering evicted and unstored
keys in a `GhostHistory` about three caches long, so it recognises reuse farther back
than the cache itself reaches. It also learns whether a request's last chunk (in a
replay, often a partial block that the next turn rewrites) is reused far less often
than the rest, and if so, stores it at the cold end.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence, Set
from itertools import chain, repeat

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import (
    Evictable,
    EvictionPolicy,
    first_evictable,
    register_policy,
)
from kvoffload.policies.ghosts import (
    ONCE,
    REUSED,
    SEEN,
    STREAM,
    TAIL,
    GhostHistory,
    SplitController,
    stamp,
)

# The last chunk of a request is demoted only after this many tails were seen:
# below it the reuse-rate comparison is noise.
_MIN_TAILS = 32
# ... and only when tails are reused at under this share of the rate of other
# once-seen chunks: a clear difference (a partial block that the next turn
# rewrites is almost never reused), not a near tie, where demoting every tail
# to the cold end costs hits (chats in which nearly every chunk returns).
_TAIL_DEMOTE_RATE = 0.5


def _probably_unknown(
    keys: Sequence[OffloadKey],
    i: int,
    young: dict[OffloadKey, int],
    old: dict[OffloadKey, int],
) -> bool:
    """Whether the keys after `keys[i]`, the first one the history does not know,
    look unknown too: the next key and the last one are probed. A key's hash
    chains its prefix, so the keys after one never seen are new as well; after
    one forgotten, the later keys (evicted earlier, tail first) are nearly always
    forgotten too. A remembered key between the probes is then taken for a new
    one (stored as once-seen, nothing learned from it). Probing every
    power-of-two distance as well gave the same 30 sequential hit ratios behind
    the documented tables, to four decimals, for more lookups.

    Such a key also stays in the history while resident: popping every key
    between the probes costs two lookups a stored key on the hottest path
    (`split` 1.57x LRU's time at 5,859 chunks instead of 1.47x, no hit ratio
    changed). It leaves when the history ages it out; if the chunk is evicted
    first, its new stamp replaces the old one, or shadows it (the young
    generation is read first). No path reads the history for a resident key:
    stores take only keys not resident, and touch only those neither segment
    holds. So it is never taken for a return while resident; only after a
    failed store (`remove`) is its old stamp read at its next sighting or
    store, as if that store had not been made."""
    n = len(keys)
    if i + 1 < n:
        key = keys[i + 1]
        if key in young or key in old:
            return False
    last = keys[n - 1]
    return not (last in young or last in old)


def _take_dominated(
    keys: Iterator[OffloadKey],
    once: OrderedDict[OffloadKey, int],
    reused_oldest: int,
    n: int,
    evictable: Evictable,
    victims: list[OffloadKey],
) -> Iterator[OffloadKey]:
    """Append to `victims` up to `n` once-seen chunks, from `keys` on (oldest
    first), last used before the reused segment's oldest chunk (`reused_oldest`,
    a stamp) or demoted as tails; return the keys not looked at.

    Such a chunk is worse on both counts the policy knows, its kind and its
    recency, than any reused chunk: the target protects the once segment's
    recent chunks, not its stale ones. It also removes what a returning
    conversation stranded: the chunks its request stored after the reused prefix
    were last used before that prefix, so they go no later than its end does,
    instead of staying resident behind a prefix that can no longer hit."""
    limit = reused_oldest >> 2
    for key in keys:
        key_stamp = once[key]
        if key_stamp >> 2 >= limit and key_stamp & 3 != TAIL:
            return chain((key,), keys)
        if evictable(key):
            victims.append(key)
            n -= 1
            if not n:
                break
    return keys


@register_policy("split")
class SplitLRUPolicy(EvictionPolicy):
    """Once-seen and reused chunks in two LRU segments with a learned split.

    Eviction takes from the once segment while it is above its target size
    (counting the chunks being stored, as one-chunk stores would), then
    once-seen chunks last used before the reused segment's oldest chunk, else from
    the reused segment (each oldest first, skipping what `evictable` refuses).
    A chunk moves to the reused segment when another request touches it, or when it
    is stored again soon after an eviction (a near miss, as in ARC), or when it
    returns from the history no later than the reused segment keeps its own chunks:
    reuse at a distance the segment cannot hold would only push out chunks it can.

    Sizes, in multiples of the capacity `c`: ghost history `3c` keys plus up to
    one eviction batch (see `GhostHistory`; a key costs about a hundred bytes, a
    chunk megabytes), and a few resident keys (see `_probably_unknown`); near
    misses count up to `c/2` evictions back. The split starts at `c/2` and moves
    by at most `c/32` every 4 requests that had near misses (`SplitController`).
    """

    chains_drain_from_tail = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        # key -> stamp (last access time and origin, see `ghosts.stamp`)
        self._once: OrderedDict[OffloadKey, int] = OrderedDict()
        self._reused: OrderedDict[OffloadKey, int] = OrderedDict()
        self._window = max(1, capacity // 2)
        self._ghosts = GhostHistory(max(2, 3 * capacity), self._window)
        self._control = SplitController(capacity, self._window)
        # Chunks touched so far, from 1 (a stamp is never 0): the clock of ages.
        self._now = 1
        self._stamp_once = stamp(1, ONCE)
        # Reuse counts of once-seen chunks, tails apart: [stored, reused] each.
        self._tail_stats = [0.0, 0.0]
        self._once_stats = [0.0, 0.0]

    @property
    def target_once(self) -> float:
        """The learned target size of the once segment."""
        return self._control.target

    def __len__(self) -> int:
        return len(self._once) + len(self._reused)

    def __contains__(self, key: object) -> bool:
        return key in self._once or key in self._reused

    def last_use(self, key: OffloadKey) -> int:
        key_stamp = self._once.get(key) or self._reused.get(key)
        return -1 if key_stamp is None else key_stamp >> 2

    def latest_use(self, keys: Iterable[OffloadKey]) -> int:
        # Stamps are the clock shifted past a 2-bit origin: the largest is the
        # latest use. Found in C.
        keys = tuple(keys)
        once = max(map(self._once.get, keys, repeat(0)), default=0)
        reused = max(map(self._reused.get, keys, repeat(0)), default=0)
        return max(once, reused) >> 2 if once or reused else -1

    @property
    def use_clock(self) -> int:
        return self._now

    # -- arrivals ------------------------------------------------------------------

    def insert(self, key: OffloadKey) -> None:
        self.insert_many((key,))

    def insert_many(self, keys: Sequence[OffloadKey]) -> None:
        # This runs for every stored chunk. Keys the history remembers come in
        # runs with one stamp (a request's chunks were stored or touched
        # together), learned from once per run. A key's hash chains its prefix,
        # so the keys after one the history does not know are nearly always
        # unknown too (unless it forgot a head before its tail). Two of them
        # are probed; if neither is known, the rest are added in a plain loop
        # without lookups (each a likely cache miss in a table of 3c keys), else
        # the loop goes on key by key.
        young, old = self._ghosts.young, self._ghosts.old
        once = self._once
        stamp_once = self._stamp_once
        run: list[OffloadKey] = []
        run_stamp = 0
        checked = False
        for i, key in enumerate(keys):
            if key in young:
                remembered = young.pop(key)
            elif key in old:
                remembered = old.pop(key)
            else:
                if run:
                    self._add_returning(run, run_stamp)
                    run = []
                once[key] = stamp_once
                if not checked:
                    checked = True
                    if _probably_unknown(keys, i, young, old):
                        for later in keys[i + 1 :]:
                            once[later] = stamp_once
                        break
                continue
            if remembered != run_stamp:
                if run:
                    self._add_returning(run, run_stamp)
                    run = []
                run_stamp = remembered
            run.append(key)
        else:
            if run:
                self._add_returning(run, run_stamp)

    def _add_returning(self, run: list[OffloadKey], key_stamp: int) -> None:
        """Insert returning keys that share one remembered stamp."""
        if self._returning(key_stamp, len(run)):
            segment, new_stamp = self._reused, self._now << 2 | REUSED
        else:
            segment, new_stamp = self._once, self._stamp_once
        for key in run:  # a loop: OrderedDict.update is slower
            segment[key] = new_stamp

    def _returning(self, key_stamp: int, n: int = 1) -> bool:
        """Learn from `n` remembered keys with this stamp seen again; True if
        they count as reused."""
        origin = key_stamp & 3
        if origin == TAIL:
            self._tail_stats[1] += n
        elif origin == ONCE:
            self._once_stats[1] += n
        if origin != SEEN:
            distance = self._ghosts.distance(key_stamp)
            if distance is not None and distance <= self._window:
                self._control.near_miss(STREAM[origin], distance, n)
                return True
        reused = self._reused
        if not reused:
            return True
        # Reused no later than the reused segment's oldest chunk was last used.
        return key_stamp >> 2 >= next(iter(reused.values())) >> 2

    def remove(self, key: OffloadKey) -> None:
        if self._once.pop(key, None) is None:
            self._reused.pop(key, None)

    def remove_many(self, keys: Sequence[OffloadKey]) -> None:
        once, reused = self._once, self._reused
        for key in keys:
            if once.pop(key, None) is None:
                reused.pop(key, None)

    # -- recency -------------------------------------------------------------------

    def touch(
        self, keys: Sequence[OffloadKey], new: Set[OffloadKey] = frozenset()
    ) -> None:
        if not keys:
            return
        now = self._now = self._now + len(keys)
        now_reused = now << 2 | REUSED  # stamp(now, REUSED), inlined
        self._stamp_once = now << 2 | ONCE
        once, reused = self._once, self._reused
        once_to_end, reused_to_end = once.move_to_end, reused.move_to_end
        stored_once = tail_reused = once_reused = 0
        for key in reversed(keys):
            if key in once:
                if key in new:
                    once_to_end(key)
                    stored_once += 1
                    continue
                if once.pop(key) & 3 == TAIL:
                    tail_reused += 1
                else:
                    once_reused += 1
                reused[key] = now_reused
            elif key in reused:
                reused_to_end(key)
                reused[key] = now_reused
            else:  # not stored: remember that a request saw it
                remembered = self._ghosts.pop(key)
                if remembered is not None:
                    self._returning(remembered)
                self._ghosts.add_seen(key, now)
        once_stats = self._once_stats
        once_stats[0] += stored_once
        if tail_reused or once_reused:
            self._tail_stats[1] += tail_reused
            once_stats[1] += once_reused
        tail = keys[-1]
        if tail in new and tail in once:
            self._store_tail(tail, now)
        control = self._control
        if control.pending:  # most requests had no near miss
            control.end_request(self._ghosts)

    def _store_tail(self, tail: OffloadKey, now: int) -> None:
        """Tag the request's last chunk; demote it if tails are reused far less."""
        once = self._once
        once[tail] = now << 2 | TAIL  # stamp(now, TAIL), inlined
        tail_stats, once_stats = self._tail_stats, self._once_stats
        tail_stats[0] += 1.0
        if tail_stats[0] >= _MIN_TAILS:
            # Stores count tails too (reuses do not): take them out.
            tail_rate = tail_stats[1] / tail_stats[0]
            others = once_stats[0] - tail_stats[0]
            if others > 0 and tail_rate < _TAIL_DEMOTE_RATE * once_stats[1] / others:
                once.move_to_end(tail, last=False)
        if once_stats[0] > self._ghosts.size:  # follow about one history length
            for stats in (tail_stats, once_stats):
                stats[0] *= 0.5
                stats[1] *= 0.5

    # -- eviction ------------------------------------------------------------------

    def evict(
        self, n: int, incoming: Sequence[OffloadKey], evictable: Evictable
    ) -> list[OffloadKey] | None:
        if n <= 0:
            return []
        once, reused = self._once, self._reused
        # Take from the once segment while it is above its target, then its
        # chunks older than every reused one, then from the reused segment; when
        # one runs out of evictable chunks, the other makes up. The incoming
        # chunks join the once segment: a batch of n takes what n stores of one
        # chunk would (each counted before the next eviction), so a new
        # conversation's first turn displaces once-seen chunks, not the reused
        # prefix of the one due next, once the segment reaches its target.
        target = math.floor(self._control.target)
        want_once = min(n, max(0, len(once) + n - 1 - target))
        from_once = iter(once)
        victims_once = first_evictable(from_once, want_once, evictable)
        want_reused = n - len(victims_once)
        if want_reused and reused:
            from_once = _take_dominated(
                from_once,
                once,
                next(iter(reused.values())),
                want_reused,
                evictable,
                victims_once,
            )
            want_reused = n - len(victims_once)
        if not want_reused:
            self._ghosts.add_evicted(victims_once, once, ONCE)
            return victims_once
        victims_reused = first_evictable(iter(reused), want_reused, evictable)
        short = want_reused - len(victims_reused)
        if short:
            more = first_evictable(from_once, short, evictable)
            if len(more) < short:
                return None  # nothing changed yet
            victims_once += more
        if victims_once:
            self._ghosts.add_evicted(victims_once, once, ONCE)
        if victims_reused:
            self._ghosts.add_evicted(victims_reused, reused, REUSED)
        return victims_once + victims_reused

    def clear(self) -> None:
        self._once.clear()
        self._reused.clear()
        self._ghosts.clear()
        self._control.clear()
        self._now = 1
        self._stamp_once = stamp(1, ONCE)
        self._tail_stats = [0.0, 0.0]
        self._once_stats = [0.0, 0.0]
