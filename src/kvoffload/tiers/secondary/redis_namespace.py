"""Deleting every key of a Redis tier's namespace, for a reset.

`SCAN MATCH` and `UNLINK` (freed by the server in the background), a batch at a
time; on a Redis Cluster the scan visits every primary and each `UNLINK` is
split by slot. Other keys on the server are never touched: it may be shared with
other models and other applications, so no `FLUSHDB`.

A namespace is literal. Every pattern handed to the server comes from
`namespace_pattern`, which escapes the glob characters a key prefix may hold
(`* ? [ ] \\`), and a name the scan returns is deleted only if the rest of it
after the prefix is a chunk key's hex: a key prefix may hold `:`, so another
tier's namespace can start with this one's (`kv:fp-a:` and `kv:fp-a:x:`).
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable

import redis
from redis.cluster import RedisCluster

from kvoffload.keys import OffloadKey

BATCH = 1000
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
# What follows the prefix in a chunk's name: `OffloadKey.hex()`, nothing else.
_KEY_HEX = re.compile(rb"(?:[0-9a-f]{2})+")


def glob_escape(text: str) -> str:
    """`text` as a literal in a `SCAN MATCH` or `KEYS` pattern."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def namespace_pattern(prefix: str) -> str:
    """The pattern of the chunk names under `prefix` (literal): the only
    pattern the tier hands to `SCAN MATCH` or `KEYS`. A superset of them still:
    see `key_of`."""
    return glob_escape(prefix) + "[0-9a-f]*"


def key_of(name: bytes, prefix: bytes) -> OffloadKey | None:
    """The chunk key of a server-side `name` if it is one of the namespace
    `prefix` (the prefix, then the key's hex); `None` for any other name."""
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    if not _KEY_HEX.fullmatch(rest):
        return None
    return OffloadKey(bytes.fromhex(rest.decode("ascii")))


def delete_namespace(
    client: redis.Redis | RedisCluster,
    prefix: str,
    stop: threading.Event,
    removed: Callable[[list[OffloadKey]], None],
) -> bool:
    """Delete every chunk key of the namespace `prefix`, calling `removed`
    with the chunks of each batch deleted. Returns whether it got to the end
    (`False`: `stop` was set). Raises what a failed call raises; deleting
    again later finishes the job."""
    raw_prefix = prefix.encode()
    names = client.scan_iter(match=namespace_pattern(prefix), count=BATCH)
    while not stop.is_set():
        batch = list(itertools.islice(names, BATCH))
        if not batch:
            return True
        found = [(name, key_of(name, raw_prefix)) for name in batch]
        mine = [(name, key) for name, key in found if key is not None]
        if mine:
            client.unlink(*(name for name, _ in mine))
            removed([key for _, key in mine])
    return False
