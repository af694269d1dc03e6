"""The primary tier under retention hints (`kv_retention_s`): what a request's
hint covers, what it outlives, and what the tier's counters say of it."""

from __future__ import annotations

import pytest

from kvoffload import CPUOffloadingManager, OffloadKey, ReqContext, make_offload_key
from kvoffload.policies import policy_names


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def keys(*ids: int) -> list[OffloadKey]:
    return [k(i) for i in ids]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def hinted(req_id: str, seconds: float | None) -> ReqContext:
    params = None if seconds is None else {"kv_retention_s": seconds}
    return ReqContext.create(req_id, params)


def serve(m: CPUOffloadingManager, ids: list[int], ctx: ReqContext) -> bool:
    """One request as the connector drives it without an engine prefix cache:
    load its leading hit, store the rest, touch all, finish. Whether it hit
    its whole prefix but the last chunk."""
    prefix = keys(*ids)
    ready = m.lookup_prefix(prefix, ctx).ready
    if ready:
        assert m.prepare_load(prefix[:ready], ctx) is not None
        m.touch(prefix[:ready], ctx)
        m.complete_load(prefix[:ready], ctx)
    out = m.prepare_store(prefix[ready:], ctx)
    if out is not None and out.keys_to_store:
        m.complete_store(out.keys_to_store, ctx)
    m.touch(prefix, ctx)
    m.on_request_finished(ctx)
    return ready >= len(ids) - 1


@pytest.mark.parametrize("policy", policy_names())
def test_a_hinted_conversation_outlives_a_flood_of_unhinted_requests(
    policy: str,
) -> None:
    """Scenario: a 3-chunk conversation asks for 60 s of retention; twenty
    one-off requests of 2 chunks each then pass through a tier of 8 chunks.
    Unhinted, the conversation is gone when it returns; hinted, it hits."""
    results = {}
    for seconds in (None, 60.0):
        clock = Clock()
        m = CPUOffloadingManager(8, policy, max_hinted_share=0.5, clock=clock)
        serve(m, [1, 2, 3], hinted("turn-1", seconds))
        for i in range(20):
            clock.now += 1
            serve(m, [100 + 2 * i, 101 + 2 * i], hinted(f"flood-{i}", None))
        clock.now += 1
        results[seconds] = serve(m, [1, 2, 3, 4], hinted("turn-2", seconds))
        stats = m.get_stats()["cpu"]
        assert stats.hints_honoured == (3 if seconds else 0)
    assert results == {None: False, 60.0: True}


def test_chunks_hinted_0_go_before_unhinted_ones() -> None:
    """Scenario: a last turn (hint 0) stores 2 chunks after two unhinted
    requests; the next store takes the last turn's chunks, not the older ones."""
    m = CPUOffloadingManager(6, "lru", clock=Clock())
    serve(m, [1, 2], hinted("a", None))
    serve(m, [3, 4], hinted("b", None))
    serve(m, [5, 6], hinted("last", 0))
    out = m.prepare_store(keys(7, 8), hinted("c", None))
    assert out is not None and set(out.evicted_keys) == {k(5), k(6)}


@pytest.mark.parametrize("policy", policy_names())
def test_a_zero_on_a_found_history_is_judged_apart_from_one_on_own_chunks(
    policy: str,
) -> None:
    """Scenario: an application said 0 of a conversation's history (chunks its
    request found in the tier) and was wrong: the next turn loaded them. A
    second conversation's history is then hinted 0, and a one-shot document
    after it stores its own chunks hinted 0. The next store evicts the
    document's chunks, end first: the 0 on a found history waits, whatever the
    document's 0 is believed on (one rate for both would send neither)."""
    m = CPUOffloadingManager(7, policy, clock=Clock())
    serve(m, [1, 2], hinted("c1-t1", None))
    serve(m, [1, 2], hinted("c1-t2", 0))
    assert m.hints_of(keys(1, 2)) == (0.0, 0.0)
    serve(m, [1, 2, 3], hinted("c1-t3", None))  # the 0 was wrong
    assert m.hints_of(keys(1, 2)) is None
    serve(m, [10, 11], hinted("c2-t1", None))
    serve(m, [10, 11], hinted("c2-t2", 0))
    serve(m, [50, 51], hinted("doc", 0))
    out = m.prepare_store(keys(60, 61), hinted("next", None))
    assert out is not None and out.evicted_keys == (k(51), k(50))


def test_an_expired_hint_counts_as_expired_unused_and_protects_nothing() -> None:
    clock = Clock()
    m = CPUOffloadingManager(4, "lru", max_hinted_share=1.0, clock=clock)
    serve(m, [1, 2], hinted("a", 10))
    assert m.get_stats()["cpu"].hinted_chunks == 2
    clock.now = 11
    stats = m.get_stats()["cpu"]
    assert stats.hinted_chunks == 0 and stats.hints_expired_unused == 2
    serve(m, [3, 4], hinted("b", None))
    out = m.prepare_store(keys(5), hinted("c", None))
    assert out is not None and out.evicted_keys == (k(2),)  # LRU's own choice


def test_the_bound_caps_the_hinted_share_of_the_tier() -> None:
    """Scenario: an application hints everything for an hour; a tier of 10
    chunks with `max_hinted_share` 0.3 holds at most 3 under hints, and stores
    keep finding room."""
    m = CPUOffloadingManager(10, "lru", max_hinted_share=0.3, clock=Clock())
    for i in range(10):
        serve(m, [10 * i, 10 * i + 1], hinted(f"r{i}", 3600))
        assert m.get_stats()["cpu"].hinted_chunks <= 3
    stats = m.get_stats()["cpu"]
    assert stats.hinted_chunks == 3 and stats.hints_dropped >= 20 - 3 - 10
    assert stats.store_skipped == 0


def test_hints_of_reports_what_a_cascade_carries() -> None:
    clock = Clock()
    m = CPUOffloadingManager(8, "lru", max_hinted_share=1.0, clock=clock)
    assert m.hints_of(keys(1)) is None  # no hint at all: nothing to carry
    serve(m, [1, 2], hinted("a", 30))
    serve(m, [3], hinted("b", 0))
    serve(m, [5], hinted("c", None))
    clock.now = 10
    assert m.hints_of(keys(1, 3, 5, 9)) == (20.0, 0.0, None, None)
    m.retain(keys(5, 9), 40)  # a promoted chunk's hint; 9 is not resident
    assert m.hints_of(keys(5, 9)) == (40.0, None)


def test_hints_that_starve_returning_requests_give_their_room_back() -> None:
    """Scenario: a tier of 20 chunks, hints bounded to 10. A session hinted for
    an hour holds 10 chunks and never returns; two unhinted conversations of 6
    chunks take turns in the other 10, each store evicting the other's, which
    comes back at once. Each return is a hit the hints' room would have kept:
    that room shrinks to its floor (a quarter of the bound), the gauge says so,
    and once a later hinted request applies it, both conversations fit and hit
    on every turn."""
    m = CPUOffloadingManager(20, "lru", max_hinted_share=0.5, clock=Clock())
    serve(m, list(range(1000, 1010)), hinted("session", 3600))
    assert m.get_stats()["cpu"].hint_room == 10
    rounds = [(list(range(100, 106)), "a"), (list(range(200, 206)), "b")]
    for turn in range(6):
        for ids, name in rounds:
            serve(m, ids, hinted(f"{name}{turn}", None))
    assert m.get_stats()["cpu"].hint_room == 2
    serve(m, [3000], hinted("later", 3600))
    assert m.get_stats()["cpu"].hinted_chunks <= 2
    for turn in range(6, 8):
        for ids, name in rounds:
            serve(m, ids, hinted(f"{name}{turn}", None))
    assert all(serve(m, ids, hinted(f"{name}9", None)) for ids, name in rounds)
