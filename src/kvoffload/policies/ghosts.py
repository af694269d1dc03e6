"""What a policy remembers about chunks it no longer holds, and what it learns from them.

`GhostHistory` is one bounded table of keys that were evicted or seen without
being stored. A returning key says that its chunk is reused, however long ago it
was seen; if it returns soon after its eviction, it also says how many more slots
its segment would have needed to hit it. `SplitController` turns those near misses
into the share of the cache each segment should hold.

Every remembered or resident key carries one int, its *stamp*: the time of its last
access times four, plus its origin. Evicting a chunk then moves its stamp as is, so
the table's hottest path allocates nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict

from kvoffload.keys import OffloadKey

# Origins, the low two bits of a stamp.
ONCE = 0  # in (or evicted from) the segment of chunks seen by one request
REUSED = 1  # in (or evicted from) the segment of reused chunks
TAIL = 2  # a once-seen chunk stored as the last chunk of its request
SEEN = 3  # seen by a request but not stored

# The segment a stamp's origin lives in: tails are once-seen chunks.
STREAM = (ONCE, REUSED, ONCE, ONCE)

# Position bins are powers of two, so 40 bins cover any realistic cache.
_BINS = 40


def stamp(time: int, origin: int) -> int:
    return time << 2 | origin


class GhostHistory:
    """A table of non-resident keys: the last `size / 2` to `size` added, plus
    up to one eviction batch.

    Two plain dicts, a young and an old generation: when the young one holds
    `size / 2` keys or more it becomes the old one and the previous old one is
    dropped. That forgets oldest first, like a least-recently-added list, at the
    cost of a dict insert per key (an ordered dict costs three times that: the
    policy's hottest path is this table). It ages after a whole eviction batch,
    so a generation can hold `size / 2 - 1 + n` keys for a batch of `n`, and the
    table up to `size - 2 + n`. Ageing in the middle of the batch that fills the
    young generation keeps it within `size` but moved 26 of the 50 hit ratios of
    `python -m kvoffload.bench policies` (by up to 0.0044) and `split` on the
    bundled trace by up to 0.002: the documented figures rest on this bound.

    Each segment also keeps a log of its eviction batches (newest last-access time
    in the batch, evictions so far). Segments evict oldest first, so a returning
    key's last access places it in that log, which says how many evictions have
    happened since its own: how much larger the segment would have had to be.
    """

    def __init__(self, size: int, window: int) -> None:
        if size < 2:
            raise ValueError(f"ghost history size must be >= 2, got {size!r}")
        self.size = size
        self.window = window
        self._half = size >> 1
        # The generations, public for the policy's inlined lookups.
        self.young: dict[OffloadKey, int] = {}
        self.old: dict[OffloadKey, int] = {}
        self._evicted = [0, 0]  # evictions so far, per segment
        self._log_time: tuple[list[int], list[int]] = ([], [])
        self._log_count: tuple[list[int], list[int]] = ([], [])
        # Keys added lately from the once segment, the reused one, and unstored
        # (halved at each new generation): each one's share of the table.
        self._added = [0.0, 0.0, 0.0]

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    def pop(self, key: OffloadKey) -> int | None:
        """Take a key's stamp out, if remembered (stamps are never 0)."""
        return self.young.pop(key, None) or self.old.pop(key, None)

    def add_evicted(
        self,
        victims: list[OffloadKey],
        segment: OrderedDict[OffloadKey, int],
        which: int,
    ) -> None:
        """Move `victims`, oldest first, from `segment` (ONCE or REUSED) into the table."""
        times = self._log_time[which]
        newest = segment[victims[-1]] >> 2
        if times and times[-1] > newest:  # a demoted tail: keep the log sorted
            newest = times[-1]
        young = self.young
        # One C-level pass, no bytecode per victim: the policy's hottest path.
        # (zip without `strict`: its keyword parsing costs more than the check,
        # and both sides walk the same list.)
        young.update(zip(victims, map(segment.pop, victims)))  # noqa: B905
        n = len(victims)
        count = self._evicted[which] = self._evicted[which] + n
        times.append(newest)
        self._log_count[which].append(count)
        self._added[which] += n
        if len(young) >= self._half:
            self._age()

    def add_seen(self, key: OffloadKey, now: int) -> None:
        self.young[key] = stamp(now, SEEN)
        self._added[2] += 1
        if len(self.young) >= self._half:
            self._age()

    def _age(self) -> None:
        """The young generation is full: it becomes the old one, the old is dropped."""
        self.old = self.young
        self.young = {}
        added = self._added
        for i in range(3):
            added[i] *= 0.5
        for which in (ONCE, REUSED):
            counts = self._log_count[which]
            if counts:  # forget batches far beyond the window
                drop = bisect_left(counts, counts[-1] - 2 * self.window)
                del self._log_time[which][:drop], counts[:drop]

    def distance(self, key_stamp: int) -> int | None:
        """Evictions from the stamp's segment since its own (1 = the latest), to
        within one batch; `None` for a key that was never stored (SEEN)."""
        origin = key_stamp & 3
        if origin == SEEN:
            return None
        which = STREAM[origin]
        times = self._log_time[which]
        if not times:
            return None
        # The first batch whose newest chunk was used no earlier than this one.
        # Past the log's start (trimmed) this overstates, beyond the window.
        i = min(bisect_left(times, key_stamp >> 2), len(times) - 1)
        return self._evicted[which] - self._log_count[which][i] + 1

    def reach(self, segment: int) -> int:
        """About how many of the segment's latest evictions are still remembered:
        the table holds the last `size` additions, this segment's share of them."""
        added = self._added
        total = added[0] + added[1] + added[2]
        if total <= 0.0:
            return 0
        return min(self._evicted[segment], int(len(self) * added[segment] / total))

    def clear(self) -> None:
        self.young = {}
        self.old = {}
        self._evicted = [0, 0]
        for log in (*self._log_time, *self._log_count):
            log.clear()
        self._added = [0.0, 0.0, 0.0]


class SplitController:
    """The target size of the once segment, set by marginal hit rates.

    A key that returns `d` evictions after it left segment S would have hit had S
    been `d` slots larger. For each segment the controller keeps those near misses
    in power-of-two bins of `d` and values the segment by its best horizon:
    max over L of (near misses within L) / L, the hits per extra slot it would earn
    if grown by L. Taking the best L, not the next slot, lets it see past a stretch
    where a larger segment gains nothing yet (chats: the next turn comes after the
    user reads and types). Horizons under `window / 8` are not considered: they
    rest on a handful of near misses, often one request's, and their rate is noise.

    Near misses arrive in bursts (a resumed conversation brings back tens of chunks
    at once), so the target moves by small steps: every `epoch` requests that had
    near misses, `step` of the capacity toward the segment valued higher, with the
    counts aged by `decay` (a memory of about 16 epochs).
    """

    def __init__(
        self,
        capacity: int,
        window: int,
        epoch: int = 4,
        step: float = 1 / 32,
        decay: float = 0.94,
    ) -> None:
        self.capacity = capacity
        self.window = window
        self.epoch = epoch
        self.step = step
        self.decay = decay
        self._min_horizon = max(1, window // 8)
        self.clear()

    def clear(self) -> None:
        # Neutral start: halfway between favouring new and favouring reused chunks.
        self.target = self.capacity / 2
        self._near = [[0.0] * _BINS, [0.0] * _BINS]
        # Ageing without touching every bin: new counts weigh 1/decay more each
        # epoch (only ratios of the counts matter), rescaled once in a while.
        self._weight = 1.0
        # Whether a near miss came since the last request ended (`end_request`
        # has nothing to do otherwise; callers may skip the call).
        self.pending = False
        self._requests = 0

    def near_miss(self, segment: int, distance: int, n: int = 1) -> None:
        self._near[segment][distance.bit_length()] += self._weight * n
        self.pending = True

    def end_request(self, ghosts: GhostHistory) -> None:
        """A request ended (its touch); adapt once `epoch` requests had near misses."""
        if not self.pending:
            return
        self.pending = False
        self._requests += 1
        if self._requests < self.epoch:
            return
        self._requests = 0
        once = self._value(self._near[ONCE], ghosts.reach(ONCE))
        reused = self._value(self._near[REUSED], ghosts.reach(REUSED))
        if once + reused > 0.0:
            moved = self.target + self.step * self.capacity * (once - reused) / (
                once + reused
            )
            self.target = min(max(moved, 0.0), float(self.capacity))
        self._weight /= self.decay
        if self._weight > 1e9:
            for near in self._near:
                for b in range(_BINS):
                    near[b] /= self._weight
            self._weight = 1.0

    def _value(self, near: list[float], reach: int) -> float:
        """Best hits-per-slot over the horizons the ghost table fully covers."""
        limit = min(reach, self.window)
        best = total = 0.0
        horizon = 1  # bin b holds distances below 2**b
        for count in near:
            if horizon > limit:
                break
            total += count
            # The shortest horizons are skipped, unless nothing longer is covered.
            if horizon >= self._min_horizon or horizon * 2 > limit:
                best = max(best, total / horizon)
            horizon <<= 1
        return best
