"""Deleting every key of a Redis tier's namespace, for a reset.

`SCAN MATCH <prefix>*` and `UNLINK` (freed by the server in the background), a
batch at a time; on a Redis Cluster the scan visits every primary and each
`UNLINK` is split by slot. Other keys on the server are never touched: it may be
shared with other models and other applications, so no `FLUSHDB`.
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


def glob_escape(text: str) -> str:
    """`text` as a literal in a MATCH pattern (a key prefix may hold `*`)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def _key_of(name: bytes, prefix: bytes) -> OffloadKey | None:
    try:
        return OffloadKey(bytes.fromhex(name[len(prefix) :].decode()))
    except (UnicodeDecodeError, ValueError):
        return None


def delete_namespace(
    client: redis.Redis | RedisCluster,
    prefix: str,
    stop: threading.Event,
    removed: Callable[[list[OffloadKey]], None],
) -> bool:
    """Delete every key that starts with `prefix`, calling `removed` with the
    chunks of each batch deleted. Returns whether it got to the end (`False`:
    `stop` was set). Raises what a failed call raises; deleting again later
    finishes the job."""
    raw_prefix = prefix.encode()
    names = client.scan_iter(match=glob_escape(prefix) + "*", count=BATCH)
    while not stop.is_set():
        batch = list(itertools.islice(names, BATCH))
        if not batch:
            return True
        client.unlink(*batch)
        keys = [_key_of(name, raw_prefix) for name in batch]
        removed([k for k in keys if k])
    return False
