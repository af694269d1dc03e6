"""Helpers the retention-hint tests share: chunk keys, an `evictable` that
takes anything, and a clock the test moves."""

from __future__ import annotations

from kvoffload.keys import OffloadKey, make_offload_key


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def always(_: OffloadKey) -> bool:
    return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
