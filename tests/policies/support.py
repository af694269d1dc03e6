"""Helpers the retention-hint tests share: chunk keys, an `evictable` that
takes anything, a clock the test moves and a policy's whole eviction order."""

from __future__ import annotations

from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies.base import EvictionPolicy


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def always(_: OffloadKey) -> bool:
    return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drain(policy: EvictionPolicy) -> list[OffloadKey]:
    """Every chunk, in the order `evict(1)` gives them up."""
    order: list[OffloadKey] = []
    while len(policy):
        victims = policy.evict(1, [], always)
        assert victims is not None
        order += victims
    return order
