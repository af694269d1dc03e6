"""Renewed retention hints written into Redis values' headers (when: see
`header_renewal`), so that another engine loading a value hands its host tier
the renewed deadline, not the first store's.

A store that finds a value present already (`SET NX` refused, or a chunk
believed present still held) reads the value's header in the same pipeline
(`GETRANGE`, about a hundred bytes); where the new hint moves its deadline far
enough, a second pipeline rewrites it, one script per value (`_RENEW`): the
server compares the header as read with the value's first bytes and, only if
they are the same, overwrites them with the renewed header (`SETRANGE`), all
in one atomic step. A Lua script, because neither command alone is safe:
`SETRANGE` creates a value that is absent (a header with no payload, after an
eviction or a reset), and a value replaced between the read and the write
(deleted and stored again by another engine, perhaps from other bytes) would
get a header describing the payload it replaced. `WATCH` would do as well only
with a connection held per value and a transaction each. The renewed header
keeps the payload checksum of the header it replaces, so even a value changed
otherwise could only fail its checks on load (a miss), never load. An error
reply (a server that forbids scripts, say) leaves the header as it was; so
does a renewal the server cannot be reached for, which also backs off as any
failed call does, without failing the store.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvoffload.keys import OffloadKey
from kvoffload.tiers.secondary.codec import (
    CorruptChunkError,
    check_header,
    renew_header,
)
from kvoffload.tiers.secondary.header_renewal import renewal_due
from kvoffload.tiers.secondary.redis_link import REDIS_ERRORS, RedisLink

_RENEW = """
local old = ARGV[1]
if redis.call('GETRANGE', KEYS[1], 0, string.len(old) - 1) ~= old then
  return 0
end
redis.call('SETRANGE', KEYS[1], 0, ARGV[2])
return 1
"""


class HeaderRead(NamedTuple):
    """A value's header as `GETRANGE` read it, and the deadline to renew it to."""

    key: OffloadKey
    name: str
    until: float
    """Unix seconds."""
    reply: Any
    """The `GETRANGE` reply: the header's bytes, or an error."""


def renew_headers(
    link: RedisLink, fingerprint: str, reads: list[HeaderRead], now: float
) -> int:
    """Rewrite the headers of `reads` that `renewal_due` says to, at Unix time
    `now`; the number rewritten."""
    pipe = link.client.pipeline(transaction=False)
    queued = 0
    for read in reads:
        new = _renewed(read, fingerprint, now)
        if new is not None:
            # Not `pipe.eval`: a cluster pipeline refuses it (redis-py 8.1),
            # yet routes the command by its one key.
            pipe.execute_command("EVAL", _RENEW, 1, read.name, read.reply, new)
            queued += 1
    if not queued:
        return 0
    try:
        replies = link.execute(pipe)
    except REDIS_ERRORS as exc:
        link.call_failed(exc)
        return 0
    return sum(1 for reply in replies if reply == 1)


def _renewed(read: HeaderRead, fingerprint: str, now: float) -> bytes | None:
    """The renewed header of `read`, or `None`: none read (an error, a value
    absent or too short), not this chunk's, format 1, or not due."""
    if not isinstance(read.reply, bytes):
        return None
    try:
        renewed = renew_header(read.reply, read.until)
        if renewed is None:
            return None
        header, new = renewed
        check_header(header, read.key, fingerprint, header.payload_len)
    except CorruptChunkError:
        return None
    if not renewal_due(header.hint_until or 0.0, read.until, now):
        return None
    return new
