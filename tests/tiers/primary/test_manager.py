"""CPUOffloadingManager: lookups, loads, stores, eviction, events, reset, bad input."""

from __future__ import annotations

import pytest

from kvoffload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    OffloadPolicy,
    ReqContext,
    make_offload_key,
)


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def keys(*ids: int) -> list[OffloadKey]:
    return [k(i) for i in ids]


CTX = ReqContext("r0")


def stored(
    m: CPUOffloadingManager, ids: list[int], ctx: ReqContext | None = None
) -> None:
    """Store `ids` as `ctx` did, by default as an earlier request, now finished (a
    request's own chunks limit what its later stores may evict)."""
    by = ctx or ReqContext(f"earlier-{ids}")
    out = m.prepare_store(keys(*ids), by)
    assert out is not None
    m.complete_store(out.keys_to_store, by)
    if ctx is None:
        m.on_request_finished(by)


def test_chunk_states_miss_pending_hit() -> None:
    m = CPUOffloadingManager(4)
    assert m.lookup(k(1), CTX) is LookupResult.MISS
    out = m.prepare_store(keys(1), CTX)
    assert out is not None and out.keys_to_store == (k(1),)
    assert m.lookup(k(1), CTX) is LookupResult.HIT_PENDING
    m.complete_store(out.keys_to_store, CTX)
    assert m.lookup(k(1), CTX) is LookupResult.HIT


def test_prepare_store_skips_present_keys_and_gives_distinct_slots() -> None:
    m = CPUOffloadingManager(4)
    stored(m, [1, 2])
    out = m.prepare_store(keys(1, 2, 3, 3), CTX)
    assert out is not None
    assert out.keys_to_store == (k(3),)
    first = m.prepare_load(keys(1, 2), CTX)
    assert len(set(first) | set(out.slots)) == 3
    assert all(0 <= s < 4 for s in (*first, *out.slots))


def test_lookup_prefix_counts_leading_ready_and_present_chunks() -> None:
    m = CPUOffloadingManager(8)
    stored(m, [1, 2])
    assert m.prepare_store(keys(3), CTX) is not None  # in flight
    stored(m, [4])
    result = m.lookup_prefix(keys(1, 2, 3, 4, 5, 6), CTX)
    assert (result.ready, result.present, result.must_wait) == (2, 4, True)
    assert m.lookup_prefix(keys(9, 1), CTX).present == 0


def test_eviction_takes_the_least_recently_used_unpinned_chunk() -> None:
    m = CPUOffloadingManager(3, enable_events=True)
    stored(m, [1, 2, 3])
    m.touch(keys(1), CTX)
    m.take_events()
    out = m.prepare_store(keys(4), ReqContext("r1"))
    assert out is not None and out.evicted_keys == (k(2),)
    assert m.lookup(k(2), CTX) is LookupResult.MISS
    events = m.take_events()
    assert [(e.keys, e.removed) for e in events] == [((k(2),), True)]


def test_pinned_in_flight_and_offered_chunks_are_never_evicted() -> None:
    m = CPUOffloadingManager(3)
    stored(m, [1, 2])
    reader = ReqContext("reader")
    m.prepare_load(keys(1), reader)  # pinned
    assert m.prepare_store(keys(3), CTX) is not None  # in flight, fills the pool
    # Only k(2) is evictable, but it is among the offered keys: no room.
    assert m.prepare_store(keys(2, 4), CTX) is None
    assert m.prepare_store(keys(4, 5), CTX) is None
    assert [m.lookup(x, CTX) for x in keys(1, 2, 3)] == [
        LookupResult.HIT,
        LookupResult.HIT,
        LookupResult.HIT_PENDING,
    ]
    out = m.prepare_store(keys(4), CTX)
    assert out is not None and out.evicted_keys == (k(2),)
    m.complete_load(keys(1), reader)
    out = m.prepare_store(keys(5), CTX)
    assert out is not None and out.evicted_keys == (k(1),)


@pytest.mark.parametrize("policy", ["lru", "arc", "split"])
def test_a_store_takes_only_chunks_ranked_below_the_requests_own(policy: str) -> None:
    """Scenario: k(1) is the oldest chunk; a request loads it and offers k(7),
    the next chunk of its prompt. A tail without its head never hits, so k(7) is
    worth no more than k(1): the store is refused rather than evict k(1) (its
    own head) or k(2) and k(3), which the policy ranks above k(1). Once another
    request has used k(1), k(2) ranks lowest, and the store takes it."""
    m = CPUOffloadingManager(3, policy)
    for i in (1, 2, 3):
        stored(m, [i])
    ctx = ReqContext("r1")
    assert m.lookup_prefix(keys(1, 7), ctx).ready == 1
    m.prepare_load(keys(1), ctx)
    m.complete_load(keys(1), ctx)
    assert m.prepare_store(keys(7), ctx) is None
    assert m.lookup_prefix(keys(1, 2, 3), CTX).ready == 3
    m.touch(keys(1), ReqContext("r2"))  # another request uses k(1): k(2) is oldest
    out = m.prepare_store(keys(7), ctx)
    assert out is not None and out.evicted_keys == (k(2),)


def test_a_load_is_not_an_access_by_itself() -> None:
    """When a load counts as a use is the connector's choice (it depends on the
    engine's prefix cache): `prepare_load` leaves recency alone, so another
    request's store takes the chunk loaded, the oldest."""
    m = CPUOffloadingManager(2)
    stored(m, [1])
    stored(m, [2])
    m.prepare_load(keys(1), CTX)
    m.complete_load(keys(1), CTX)
    out = m.prepare_store(keys(3), ReqContext("other"))
    assert out is not None and out.evicted_keys == (k(1),)


def test_prepare_load_of_a_chunk_no_longer_readable_pins_nothing() -> None:
    """A load naming an evicted chunk and one in flight answers None; the
    readable chunk named with them is not pinned (it is still evictable)."""
    m = CPUOffloadingManager(2)
    stored(m, [1])
    assert m.prepare_store(keys(2), CTX) is not None  # in flight
    assert m.prepare_load(keys(1, 9), CTX) is None
    assert m.prepare_load(keys(1, 2), CTX) is None
    m.complete_store(keys(2), CTX)
    out = m.prepare_store(keys(3), CTX)
    assert out is not None and out.evicted_keys == (k(1),)
    assert m.get_stats()["cpu"].chunks_loaded == 0


def test_failed_prepare_store_changes_nothing() -> None:
    m = CPUOffloadingManager(2)
    stored(m, [1, 2])
    before = m.get_stats()["cpu"]
    assert m.prepare_store(keys(3, 4, 5), CTX) is None
    assert m.lookup_prefix(keys(1, 2), CTX).ready == 2
    after = m.get_stats()["cpu"]
    assert after.occupancy == before.occupancy == 2
    assert after.store_skipped == 3


def test_failed_store_frees_the_slot() -> None:
    m = CPUOffloadingManager(1)
    out = m.prepare_store(keys(1), CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX, success=False)
    assert m.lookup(k(1), CTX) is LookupResult.MISS
    again = m.prepare_store(keys(2), CTX)
    assert again is not None and again.slots == out.slots
    assert m.get_stats()["cpu"].failures == 1


def test_aborted_store_frees_the_slot_without_counting_a_failure() -> None:
    """Scenario: a promotion's load from a secondary tier failed: its reserved
    slot is free again, and host memory counts neither a failure nor a store,
    nor announces anything."""
    m = CPUOffloadingManager(1, enable_events=True)
    out = m.prepare_store(keys(1), CTX, promotion=True)
    assert out is not None
    m.abort_store(out.keys_to_store)
    m.abort_store(out.keys_to_store)  # no longer in flight: ignored
    assert m.lookup(k(1), CTX) is LookupResult.MISS
    again = m.prepare_store(keys(2), CTX)
    assert again is not None and again.slots == out.slots
    stats = m.get_stats()["cpu"]
    assert (stats.failures, stats.chunks_stored, stats.occupancy) == (0, 0, 1)
    assert m.take_events() == []


def test_a_promoted_chunk_is_reuse_for_the_request_that_loads_it() -> None:
    """Scenario: a chunk promoted from a secondary tier for a request, which then
    loads and touches it. Another request stored it earlier, so the touch counts
    as reuse, not as the request's own store: ARC keeps it over a chunk seen once."""
    m = CPUOffloadingManager(2, "arc")
    out = m.prepare_store(keys(1), CTX, promotion=True)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)
    m.prepare_load(keys(1), CTX)
    m.complete_load(keys(1), CTX)
    m.touch(keys(1), CTX)
    stored(m, [2])
    full = m.prepare_store(keys(3), ReqContext("r1"))
    assert full is not None and full.evicted_keys == (k(2),)


def test_stored_events_are_emitted_once_readable() -> None:
    m = CPUOffloadingManager(4, enable_events=True)
    out = m.prepare_store(keys(1, 2), CTX)
    assert out is not None
    assert m.take_events() == []
    m.complete_store(out.keys_to_store, CTX)
    events = m.take_events()
    assert [(e.keys, e.removed, e.medium) for e in events] == [
        ((k(1), k(2)), False, "cpu")
    ]
    assert m.take_events() == []


def test_events_are_off_by_default() -> None:
    m = CPUOffloadingManager(4)
    stored(m, [1])
    assert m.take_events() == []


def test_reset_drops_everything_and_ignores_late_completions() -> None:
    m = CPUOffloadingManager(2)
    stored(m, [1])
    late = m.prepare_store(keys(2), CTX)
    assert late is not None
    m.prepare_load(keys(1), CTX)
    m.reset_cache()
    assert m.lookup(k(1), CTX) is LookupResult.MISS
    m.complete_store(late.keys_to_store, CTX)
    m.complete_load(keys(1), CTX)
    assert m.lookup(k(2), CTX) is LookupResult.MISS
    stored(m, [3, 4])
    assert m.lookup_prefix(keys(3, 4), CTX).ready == 2


def test_reset_holds_busy_slots_until_released() -> None:
    """Scenario: a copy into slot s (a store planned before the reset) is still
    running when the tier resets. No store gets s until it is released; s is
    neither occupied nor free meanwhile; once released the whole pool is usable."""
    m = CPUOffloadingManager(3)
    stored(m, [1])
    busy = m.prepare_store(keys(2), CTX)
    assert busy is not None
    (slot,) = busy.slots
    m.reset_cache(busy_slots=[slot])
    assert m.num_free_slots() == 2
    assert m.get_stats()["cpu"].occupancy == 0
    assert m.prepare_store(keys(3, 4, 5), CTX) is None, "a held slot was free"
    out = m.prepare_store(keys(3, 4), CTX)
    assert out is not None and slot not in out.slots
    assert m.num_free_slots() == 0
    m.release_slots([slot])
    after = m.prepare_store(keys(5), CTX)
    assert after is not None and after.slots == (slot,)
    assert m.get_stats()["cpu"].occupancy == 3


def test_a_slot_held_twice_is_free_after_two_releases() -> None:
    """Scenario: two loads planned before a reset read the same slot; it stays
    held until both have ended, and a second reset keeps it held too."""
    m = CPUOffloadingManager(1)
    stored(m, [1])
    (slot,) = m.prepare_load(keys(1), CTX) or ()
    m.prepare_load(keys(1), CTX)
    m.reset_cache(busy_slots=[slot, slot])
    m.reset_cache()
    m.release_slots([slot])
    assert m.prepare_store(keys(2), CTX) is None
    m.release_slots([slot])
    m.release_slots([slot])  # not held any more: ignored
    out = m.prepare_store(keys(2), CTX)
    assert out is not None and out.slots == (slot,)
    assert m.prepare_store(keys(3), CTX) is None, "one slot handed out twice"


def test_reset_announces_what_was_readable_as_removed() -> None:
    m = CPUOffloadingManager(4, enable_events=True)
    stored(m, [1, 2])
    writing = m.prepare_store(keys(3), CTX)
    assert writing is not None
    m.take_events()
    m.reset_cache()
    events = m.take_events()
    assert [(set(e.keys), e.removed) for e in events] == [({k(1), k(2)}, True)]
    m.reset_cache()
    assert m.take_events() == [], "an empty tier announces nothing"


def test_on_new_request_gives_chunk_level_policy() -> None:
    m = CPUOffloadingManager(2)
    assert m.on_new_request(CTX).policy is OffloadPolicy.CHUNK_LEVEL
    assert OffloadPolicy("block_level") is OffloadPolicy.CHUNK_LEVEL
    assert OffloadPolicy.BLOCK_LEVEL is OffloadPolicy.CHUNK_LEVEL


def test_stats_count_lookups_hits_stores_evictions() -> None:
    m = CPUOffloadingManager(2)
    stored(m, [1, 2])
    m.lookup_prefix(keys(1, 2, 3), CTX)
    stored(m, [3])
    stats = m.get_stats()["cpu"]
    assert (stats.hits, stats.chunks_stored, stats.evictions) == (2, 3, 1)
    assert stats.lookups == 3 and stats.capacity == 2 and stats.occupancy == 2


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_chunks": 0}, "num_chunks"),
        ({"num_chunks": 2.5}, "num_chunks"),
        ({"eviction_policy": "fifo-ish"}, "eviction_policy"),
        ({"store_threshold": -1}, "store_threshold"),
        ({"max_tracker_size": 0}, "max_tracker_size"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(
    kwargs: dict[str, object], name: str
) -> None:
    args: dict[str, object] = {"num_chunks": 4, **kwargs}
    with pytest.raises(ValueError, match=name):
        CPUOffloadingManager(**args)  # type: ignore[arg-type]


def test_pins_protect_without_counting_as_loads() -> None:
    m = CPUOffloadingManager(1)
    stored(m, [1])
    (slot,) = m.pin(keys(1))
    assert m.prepare_store(keys(2), CTX) is None
    m.unpin(keys(1))
    m.unpin(keys(1))  # extra unpins are ignored
    out = m.prepare_store(keys(2), CTX)
    assert out is not None and out.slots == (slot,)
    assert m.get_stats()["cpu"].chunks_loaded == 0


def test_a_promotion_stores_a_chunk_the_filter_would_reject() -> None:
    m = CPUOffloadingManager(4, store_threshold=2)
    out = m.prepare_store(keys(1), CTX)
    assert out is not None and out.keys_to_store == ()
    out = m.prepare_store(keys(1), CTX, promotion=True)
    assert out is not None and out.keys_to_store == (k(1),)
