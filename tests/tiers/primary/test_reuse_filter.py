"""The reuse filter inside the manager: thresholds, distinct requests, tracker bound."""

from __future__ import annotations

import pytest

from kvoffload import CPUOffloadingManager, OffloadKey, ReqContext, make_offload_key


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def offer(m: CPUOffloadingManager, req: str, ids: list[int]) -> tuple[OffloadKey, ...]:
    """One request's path: look its keys up, then offer them for storing."""
    ctx = ReqContext(req)
    m.on_new_request(ctx)
    keys = [k(i) for i in ids]
    m.lookup_prefix(keys, ctx)
    out = m.prepare_store(keys, ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx)
    m.on_request_finished(ctx)
    return out.keys_to_store


@pytest.mark.parametrize("threshold", [0, 1])
def test_threshold_zero_and_one_admit_at_first_sight(threshold: int) -> None:
    m = CPUOffloadingManager(8, store_threshold=threshold)
    assert offer(m, "a", [1, 2]) == (k(1), k(2))


@pytest.mark.parametrize("threshold", [2, 3])
def test_chunks_are_admitted_from_the_thresholdth_distinct_request(
    threshold: int,
) -> None:
    m = CPUOffloadingManager(8, store_threshold=threshold)
    for n in range(1, threshold):
        assert offer(m, f"r{n}", [1, 2]) == (), f"request {n} must not store"
    assert offer(m, "last", [1, 2]) == (k(1), k(2))


def test_a_request_seeing_a_key_twice_counts_once() -> None:
    m = CPUOffloadingManager(8, store_threshold=2)
    ctx = ReqContext("same")
    m.on_new_request(ctx)
    for _ in range(3):
        m.lookup_prefix([k(1)], ctx)
        m.lookup(k(1), ctx)
    out = m.prepare_store([k(1)], ctx)
    assert out is not None and out.keys_to_store == ()
    m.on_request_finished(ctx)
    assert offer(m, "other", [1]) == (k(1),)


def test_only_lookups_count_not_offers_to_store() -> None:
    """Scenario: as in the seed (vLLM PR #41727), a key counts as seen when a
    request looks it up. Two requests offer X for storing without looking it up
    (their loads capped at 0, or X a chunk they generated): X is still unseen,
    so the two that look it up next are its first and second sightings, and
    only the second stores it."""
    m = CPUOffloadingManager(8, store_threshold=2)
    for req in ("a", "b"):
        ctx = ReqContext(req)
        m.on_new_request(ctx)
        out = m.prepare_store([k(1)], ctx)
        assert out is not None and out.keys_to_store == ()
        m.on_request_finished(ctx)
    assert offer(m, "c", [1]) == ()
    assert offer(m, "d", [1]) == (k(1),)
    assert m.get_stats()["cpu"].admission_rejected == 3


def test_keys_past_the_first_miss_are_counted_too() -> None:
    m = CPUOffloadingManager(8, store_threshold=2)
    offer(m, "a", [1, 2, 3])
    assert offer(m, "b", [9, 2, 3]) == (k(2), k(3))


def test_tracker_forgets_the_least_recently_seen_key() -> None:
    m = CPUOffloadingManager(8, store_threshold=2, max_tracker_size=2)
    offer(m, "a", [1])
    offer(m, "b", [2])
    offer(m, "c", [3])  # table full: forgets k(1)
    assert offer(m, "d", [1]) == ()
    assert offer(m, "e", [3]) == (k(3),)
    stats = m.get_stats()["cpu"]
    assert stats.admission_rejected >= 4


def test_a_request_seeing_a_key_again_makes_it_the_most_recently_seen() -> None:
    """Scenario: request A looks up X, B looks up Y, then A looks X up again;
    C's key fills the two-key table. Y, seen least recently, is forgotten, not
    X: when D sees X, two distinct requests have seen it and it is stored."""
    m = CPUOffloadingManager(8, store_threshold=2, max_tracker_size=2)
    a, b = ReqContext("a"), ReqContext("b")
    m.on_new_request(a)
    m.on_new_request(b)
    m.lookup_prefix([k(1)], a)
    m.lookup_prefix([k(2)], b)
    m.lookup(k(1), a)  # A sees X again: counts once, refreshes it
    out = m.prepare_store([k(1)], a)
    assert out is not None and out.keys_to_store == ()
    assert offer(m, "c", [3]) == ()
    assert offer(m, "d", [1]) == (k(1),)
    assert offer(m, "e", [2]) == ()  # Y was forgotten: e is its first sighting


def test_a_key_forgotten_during_a_request_counts_again_for_it() -> None:
    """Scenario: request A sees X, the one-key table forgets X for B's key, and A
    sees X again. The table has no count for X, so A's sighting counts (1), once:
    A's later sightings add nothing, and C is X's second distinct request."""
    m = CPUOffloadingManager(8, store_threshold=2, max_tracker_size=1)
    a = ReqContext("a")
    m.on_new_request(a)
    m.lookup_prefix([k(1)], a)
    assert offer(m, "b", [2]) == ()  # forgets k(1)
    m.lookup_prefix([k(1)], a)
    out = m.prepare_store([k(1)], a)
    assert out is not None and out.keys_to_store == ()
    m.on_request_finished(a)
    assert offer(m, "c", [1]) == (k(1),)
