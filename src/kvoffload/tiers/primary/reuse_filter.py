"""Admission by reuse: store a chunk only once enough distinct requests saw it.

With `threshold >= 2` a key is admitted once at least `threshold` distinct
requests have looked it up; offering a key for store is no sighting (as in the
seed, vLLM PR #41727). A request that looks a key up several times counts once.
The counter table keeps at most `max_size` keys and forgets the least recently
seen first; every sighting, a request's repeated ones too, counts as seen.
`threshold` 0 or 1 disables the filter.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvoffload.config import is_count, shown
from kvoffload.keys import OffloadKey


class ReuseFilter:
    """Counts distinct requests per key in a bounded, least-recently-seen table."""

    def __init__(self, threshold: int, max_size: int) -> None:
        if not is_count(threshold, 0):
            raise ValueError(
                f"store_threshold must be an int >= 0 (0 or 1 disables the "
                f"reuse filter), got {shown(threshold)}"
            )
        if not is_count(max_size, 1):
            raise ValueError(
                f"max_tracker_size must be an int >= 1, got {shown(max_size)}"
            )
        self.threshold = threshold
        self.max_size = max_size
        self.enabled = threshold >= 2
        self._counts: OrderedDict[OffloadKey, int] = OrderedDict()
        self._seen_by_request: dict[str, set[OffloadKey]] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def count(self, key: OffloadKey) -> int:
        """Distinct requests that saw `key` (0 if forgotten or never seen)."""
        return self._counts.get(key, 0)

    def observe(self, keys: Iterable[OffloadKey], req_id: str) -> None:
        """Record that request `req_id` saw `keys`.

        Every sighting makes the key the most recently seen; its count rises
        only at the request's first sighting of it. A key the table forgot
        after the request saw it counts again (1) at that request's next
        sighting, since the table holds nothing else of it."""
        if not self.enabled:
            return
        seen = self._seen_by_request.get(req_id)
        if seen is None:
            seen = self._seen_by_request[req_id] = set()
        counts = self._counts
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                if key not in seen:
                    seen.add(key)
                    counts[key] += 1
            else:
                if len(counts) >= self.max_size:
                    counts.popitem(last=False)
                counts[key] = 1
                seen.add(key)

    def admitted(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """The keys seen by at least `threshold` distinct requests."""
        if not self.enabled:
            return list(keys)
        counts, threshold = self._counts, self.threshold
        return [key for key in keys if counts.get(key, 0) >= threshold]

    def finish_request(self, req_id: str) -> None:
        """Forget which keys `req_id` saw (its counts stay)."""
        self._seen_by_request.pop(req_id, None)

    def clear(self) -> None:
        self._counts.clear()
        self._seen_by_request.clear()
