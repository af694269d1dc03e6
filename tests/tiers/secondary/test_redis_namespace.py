"""A Redis tier's namespace is literal: a reset deletes its own chunk keys and
never another namespace's, whatever glob characters (`* ? [ ] \\`) or `:` its
key prefix holds. Against a real server."""

from __future__ import annotations

import threading

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.tiers.secondary import ArrayChunkBuffer, RedisTierConfig
from kvoffload.tiers.secondary.redis_namespace import delete_namespace
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiers.secondary.secondary_support import GROUPS, Jobs, key, payload, settle

GLOB = "*?[]\\"
PREFIXES = [
    *GLOB,
    *(f"kv{c}" for c in GLOB),
    "kv[a]",
    "kv[!x]",
    "kv[^x]",
    "kv[a-z]",
    "kv\\*",
    "kv\\\\",
    "k*v?",
    "[*]",
    "\\[kv\\]",
    "kv\\",
    "*:*",
]


def neighbours(prefix: str) -> set[str]:
    """Key prefixes a glob reading of `prefix` would match or overlap: each
    glob character read as a wildcard, or dropped; `prefix` extended; and a
    namespace nested in this one's (a prefix holding `:`)."""
    out = {prefix + "x", "x" + prefix, prefix.replace("\\", ""), prefix + ":m:x"}
    for c in GLOB:
        out.add(prefix.replace(c, "x"))
        out.add(prefix.replace(c, ""))
        out.add(prefix.replace(c, "xy"))
    out.add(prefix[:-1] or "x")
    out.discard(prefix)
    out.discard("")
    return out


def stored(tier: RedisTier, buffer: ArrayChunkBuffer, i: int) -> None:
    buffer.slot_view(0)[: GROUPS[0]] = payload(key(i), GROUPS[0])
    assert Jobs(tier).store([key(i)], [0]).success


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_reset_deletes_only_its_own_namespace(
    redis_url: str, buffer: ArrayChunkBuffer, prefix: str
) -> None:
    """Scenario: a tier with glob characters in its key prefix shares a server
    with tiers whose prefixes the glob would match (`kv*` and `kvx`), with a
    tier whose namespace is nested in its own (`kv*:m:x:`), and with another
    application's keys. A reset deletes its own chunks, and every other key
    survives."""
    server = redis.Redis.from_url(redis_url)
    mine = RedisTier(RedisTierConfig(redis_url, key_prefix=prefix), buffer, "m")
    others = [
        RedisTier(RedisTierConfig(redis_url, key_prefix=p), buffer, "m")
        for p in sorted(neighbours(prefix))
    ]
    stored(mine, buffer, 1)
    for other in others:
        stored(other, buffer, 2)
    foreign = [f"{prefix}:m:", f"{prefix}:m:zz", f"{prefix}:m:ABCD", f"{prefix}:m:a"]
    for name in foreign:
        server.set(name, b"another application's")
    mine.reset_cache()
    settle(mine)
    assert server.exists(mine.redis_key(key(1))) == 0
    kept = [other.redis_key(key(2)) for other in others]
    assert server.exists(*kept, *foreign) == len(kept) + len(foreign)
    for tier in (mine, *others):
        tier.shutdown()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    mine=st.text(alphabet="ka:*?[]\\^!-", min_size=1, max_size=6),
    other=st.text(alphabet="ka:*?[]\\^!-", min_size=1, max_size=6),
    nested=st.booleans(),
)
def test_any_prefix_is_literal(
    redis_url: str, mine: str, other: str, nested: bool
) -> None:
    """Generated pairs of key prefixes built from glob characters, `:`, a hex
    digit and bracket syntax, each a namespace `<prefix>:m:` as the tier names
    it: deleting one removes exactly its own chunk keys, never the other's,
    unless they are the same namespace. `nested`: the other prefix starts
    with this namespace."""
    if nested:
        other = f"{mine}:m:{other}"
    server = redis.Redis.from_url(redis_url)
    server.flushall()
    mine, other = f"{mine}:m:", f"{other}:m:"
    hexes = [key(i).hex() for i in range(3)]
    server.mset({f"{mine}{h}": b"1" for h in hexes})
    server.mset({f"{other}{h}": b"2" for h in hexes})
    removed: list[bytes] = []
    assert delete_namespace(server, mine, threading.Event(), removed.extend)
    left = {name.decode() for name in server.scan_iter()}
    assert left == ({f"{other}{h}" for h in hexes} if other != mine else set())
    assert sorted(removed) == sorted(key(i) for i in range(3))
