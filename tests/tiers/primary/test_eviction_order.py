"""`CPUOffloadingManager.eviction_order`: the chunks the policy would evict
next, named without changing what it evicts."""

from __future__ import annotations

import random

import pytest

from kvoffload import CPUOffloadingManager, ReqContext
from tests.tiers.primary.test_manager import k, keys


def _workload(m: CPUOffloadingManager, seed: int, peek: bool) -> list[list[bytes]]:
    """Requests storing and hitting chunks of a few conversations; with `peek`,
    the eviction order is asked before every request. Returns each store's
    victims."""
    rng, sizes = random.Random(seed), random.Random(-seed)
    victims: list[list[bytes]] = []
    for i in range(300):
        conversation = rng.randrange(12)
        depth = rng.randrange(1, 8)
        ids = [conversation * 100 + d for d in range(depth)]
        ctx = ReqContext(f"r{i}")
        if peek:
            m.eviction_order(sizes.randrange(1, 40))
        hits = 0
        while hits < len(ids) and m.get_slot(k(ids[hits])) is not None:
            hits += 1
        if hits:
            m.prepare_load(keys(*ids[:hits]), ctx)
            m.complete_load(keys(*ids[:hits]), ctx)
            m.touch(keys(*ids[:hits]), ctx)
        out = m.prepare_store(keys(*ids[hits:]), ctx)
        if out is not None:
            m.complete_store(out.keys_to_store, ctx)
            victims.append(sorted(out.evicted_keys))
        m.on_request_finished(ctx)
    return victims


@pytest.mark.parametrize("policy", ["lru", "arc", "split"])
def test_asking_the_order_changes_no_eviction(policy: str) -> None:
    for seed in range(3):
        plain = _workload(CPUOffloadingManager(24, policy), seed, peek=False)
        peeked = _workload(CPUOffloadingManager(24, policy), seed, peek=True)
        assert plain == peeked


@pytest.mark.parametrize("policy", ["lru", "arc", "split"])
def test_the_order_names_the_next_victims(policy: str) -> None:
    """The first n of the order are what a store of n new chunks evicts."""
    m = CPUOffloadingManager(24, policy)
    _workload(m, 7, peek=False)
    assert m.num_free_slots() == 0
    order = m.eviction_order(5)
    assert len(order) == 5 and len(set(order)) == 5
    out = m.prepare_store(keys(*range(9000, 9005)), ReqContext("new"))
    assert out is not None and sorted(out.evicted_keys) == sorted(order)


def test_chunks_being_written_are_not_named() -> None:
    m = CPUOffloadingManager(4)
    out = m.prepare_store(keys(1, 2), ReqContext("w"))
    assert out is not None
    assert m.eviction_order(4) == []
    m.complete_store(out.keys_to_store, ReqContext("w"))
    assert sorted(m.eviction_order(4)) == sorted(keys(1, 2))
