"""When a stored chunk's header is rewritten for a renewed retention hint.

A chunk's header (format 2, see `codec`) holds the deadline of its hint in Unix
seconds, so that a restarted engine, or another engine sharing the file tier's
directory or the Redis server, reads the hint back. A returning request renews
the hint (a touch, or a cascade of a chunk the tier holds already under a later
hint); the file and Redis tiers then rewrite the header's deadline in place (the
header only: flags, deadline and the header's checksum, never the payload).

A request touching its prefix every step would move the deadline a few
milliseconds each time: writing each move would cost a write per chunk per
step. The header is rewritten only when the new deadline is later than the
one it holds by more than a quarter of the new hint's length, and by at least
a second (`renewal_due`): a chunk touched without pause under a hint of S
seconds is written about once every S/4 seconds, and what a restart reads
falls short of the live deadline by at most a quarter of the hint (a second
for hints under four). A deadline that moves earlier is never written: the
header keeps the later one, as the tiers' own hints do.
"""

from __future__ import annotations

RENEW_FRACTION = 0.25
"""Of the new hint's length: how much later the deadline must move."""
RENEW_MIN_S = 1.0
"""Seconds the deadline must move at least."""


def renewal_due(stored: float | None, until: float, now: float) -> bool:
    """Whether a header holding the deadline `stored` (Unix seconds; 0.0 for
    none, or hinted 0; `None`: not known, so the header is to be read) is to
    be rewritten to hold `until`, at Unix time `now`."""
    if not until > now:
        return False  # also NaN: no deadline to write
    return stored is None or stored < renewal_floor(until, now)


def renewal_floor(until: float, now: float) -> float:
    """For `until` later than `now`: the deadline a header must hold, at
    least, not to be rewritten to hold `until` (see `renewal_due`)."""
    return until - max(RENEW_MIN_S, RENEW_FRACTION * (until - now))
