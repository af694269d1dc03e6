"""The use floor: a store spares the chunks used after its request's own.

Where the eviction policy keeps a clock of uses (`EvictionPolicy.use_clock`:
`split`), a store's victims must also have been used no later than the latest
use, before the request arrived, of the chunks it loaded or found in the tier.
In conversations taking turns, what was used since belongs to conversations
served after this one, which come back before it does again (docs/policies.md,
"A store spares what was used after the request's own chunks").
"""

from __future__ import annotations

from collections.abc import Set
from itertools import chain

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import EvictionPolicy

FLOOR_REACH = 2
"""How far back, in capacities of chunk uses on the policy's clock, a
request's own chunks may have been last used for its stores to spare the
chunks used since: about a round of conversations through the tier. Past it
the tier would have turned over, and the order of those uses says nothing of
who returns first."""


class UseFloor:
    """The policy's clock at each live request's arrival, and the floor of
    use its stores' victims stay under."""

    def __init__(self, policy: EvictionPolicy, capacity: int) -> None:
        self._policy = policy
        self._reach = FLOOR_REACH * capacity
        self._keeps_clock = policy.use_clock is not None
        self._arrived_at: dict[str, int] = {}

    def arrived(self, req_id: str) -> None:
        """`req_id` arrived (a repeat, after a preemption, keeps the first)."""
        if self._keeps_clock:
            clock = self._policy.use_clock
            if clock is not None:
                self._arrived_at.setdefault(req_id, clock)

    def finished(self, req_id: str) -> None:
        self._arrived_at.pop(req_id, None)

    def of(
        self, loaded: Set[OffloadKey], offered: Set[OffloadKey], req_id: str
    ) -> int | None:
        """The latest use, on the policy's clock, of the chunks a store's
        request loaded or found here, if it came before the request arrived:
        its victims must have been used no later. `None` for no such limit: a
        policy without a clock of uses, a request that has no such chunk here,
        one whose chunks were used since it arrived (by itself, as a rule:
        without a device cache the connector touches a load before the store),
        or one whose chunks were last used more than `FLOOR_REACH` capacities
        of uses ago. (A request not announced by `arrived` counts as arrived
        now.)"""
        policy = self._policy
        now = policy.use_clock
        if now is None or not (loaded or offered):
            return None
        # A use stamped after the clock's reading at arrival came after it;
        # one stamped `now` leaves nothing used since.
        since = min(self._arrived_at.get(req_id, now) + 1, now)
        # The usual case first, in one lookup: a chunk the request used itself
        # (every chunk it loaded, once the connector has touched them).
        if policy.last_use(next(iter(loaded or offered))) >= since:
            return None
        floor = policy.latest_use(chain(loaded, offered))
        if floor < 0 or floor >= since or now - floor > self._reach:
            return None
        return floor
