"""What a Redis tier believes its server holds, and the keys it must ask about.

The scheduler thread never waits on the network: a key without a fresh answer
is queued, the queue goes to the server as one batch of `PTTL` calls at the end
of the step, and the answers are kept briefly. A present value is trusted for
`hit_cache_s` at most, and never past the time it has left on the server; an
absent one for `miss_cache_s`. Answers are bounded in number, the oldest
forgotten first. `RedisTier` and the planner's `ModeledRedisTier` share these
rules through this class, so the planner cannot drift from the tier.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvoffload.keys import OffloadKey

MAX_KNOWN_KEYS = 200_000
"""Answers remembered; the oldest are forgotten first."""


class PresenceCache:
    """Per key: present or not, and until when that answer is trusted; plus the
    keys queued for the next batch of checks and those being checked."""

    def __init__(
        self, hit_cache_s: float, miss_cache_s: float, max_keys: int = MAX_KNOWN_KEYS
    ) -> None:
        self._hit_cache_s = hit_cache_s
        self._miss_cache_s = miss_cache_s
        self._max_keys = max_keys
        self._known: OrderedDict[OffloadKey, tuple[bool, float]] = OrderedDict()
        self._to_ask: dict[OffloadKey, None] = {}
        self._asking: set[OffloadKey] = set()

    def answer(self, key: OffloadKey, now: float) -> bool | None:
        """Whether the server holds `key`, or None without a fresh answer."""
        known = self._known.get(key)
        if known is None or known[1] <= now:
            return None
        return known[0]

    def believed_present(self, key: OffloadKey, now: float) -> bool:
        return self.answer(key, now) is True

    def ask(self, key: OffloadKey) -> int:
        """Queue `key` for the next batch unless it is queued or being checked
        already; the number of keys queued."""
        if key not in self._asking:
            self._to_ask[key] = None
        return len(self._to_ask)

    def ask_stale(self, keys: Sequence[OffloadKey], now: float) -> None:
        """Queue those of `keys` without a fresh answer."""
        for key in keys:
            if self.answer(key, now) is None:
                self.ask(key)

    def take_questions(self) -> list[OffloadKey]:
        """The queued keys, now being checked."""
        keys = list(self._to_ask)
        self._to_ask.clear()
        self._asking.update(keys)
        return keys

    def drop_questions(self) -> None:
        """Forget the queued keys (the server cannot be asked)."""
        self._to_ask.clear()

    def answered(self, keys: list[OffloadKey]) -> None:
        """The check of `keys` has ended (with answers or without)."""
        self._asking.difference_update(keys)

    def remember(self, key: OffloadKey, lifetime: float, now: float) -> None:
        """As of `now`, the server holds `key`'s value for `lifetime` more
        seconds (`math.inf`: no expiry; 0: absent)."""
        present = lifetime > 0
        trusted = min(self._hit_cache_s, lifetime) if present else self._miss_cache_s
        known = self._known
        known[key] = (present, now + trusted)
        known.move_to_end(key)
        while len(known) > self._max_keys:
            known.popitem(last=False)

    def clear(self) -> None:
        """Forget every answer and every queued key."""
        self._known.clear()
        self._to_ask.clear()

    @property
    def queued(self) -> bool:
        return bool(self._to_ask)

    @property
    def checking(self) -> bool:
        return bool(self._asking)
