"""Split LRU scenarios: segments, near misses, the learned split, tails, history.

The contract (all-or-nothing, pins, len/contains) is checked for every registered
policy by test_policy_contract.py; these name what is particular to `split`.
"""

from __future__ import annotations

from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies import SplitLRUPolicy, create_policy
from kvoffload.policies.ghosts import (
    ONCE,
    REUSED,
    SEEN,
    GhostHistory,
    SplitController,
    stamp,
)


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def always(_: OffloadKey) -> bool:
    return True


def store(
    policy: SplitLRUPolicy, keys: list[OffloadKey], batch: bool = False
) -> list[OffloadKey]:
    """One request over `keys`, as the manager drives it: store the absent ones
    (evicting as needed; in one `insert_many` if `batch`, as the manager does),
    then touch them all, naming the stored ones as new."""
    absent = [key for key in keys if key not in policy]
    free = policy.capacity - len(policy)
    victims = policy.evict(max(0, len(absent) - free), absent, always)
    assert victims is not None
    if batch:
        policy.insert_many(absent)
    else:
        for key in absent:
            policy.insert(key)
    policy.touch(keys, new=frozenset(absent))
    return victims


def test_registered_as_split() -> None:
    assert isinstance(create_policy("split", 4), SplitLRUPolicy)


def test_reused_chunks_outlive_a_scan_of_one_time_chunks() -> None:
    """Scenario: a 2-chunk prefix is reused, then 20 one-time chunks stream by."""
    policy = SplitLRUPolicy(6)
    store(policy, [k(0), k(1)])
    policy.touch([k(0), k(1)])  # a second request reuses the prefix
    for i in range(100, 120):
        store(policy, [k(i)])
    assert k(0) in policy and k(1) in policy


def test_own_new_chunks_are_not_reuse() -> None:
    """Scenario: a request stores and touches its chunks; nobody else reads them."""
    policy = SplitLRUPolicy(4)
    store(policy, [k(0), k(1)])
    policy.touch([k(2)])  # unknown: remembered as seen, not stored
    # Both are still once-seen: with the split's target above them, a new
    # request's store takes the older of the two, k(1) (the head k(0) is newer).
    assert len(policy) == 2
    victims = store(policy, [k(10), k(11), k(12)])
    assert victims == [k(1)]


def test_head_of_a_request_outlives_its_tail() -> None:
    policy = SplitLRUPolicy(3)
    store(policy, [k(0), k(1), k(2)])
    assert store(policy, [k(9)]) == [k(2)]


def test_a_continuation_leaves_before_the_reused_prefix_it_follows() -> None:
    """Scenario: a conversation's second turn reuses its first turn's chunks and
    stores two more; then a store needs room while the once segment is below its
    target. The second turn's own chunks, last used before its reused prefix,
    go first: evicting the end of the prefix instead would strand them (a hit
    is a leading run, so nothing after a missing chunk can hit)."""
    policy = SplitLRUPolicy(4)  # target of the once segment: 2
    store(policy, [k(0), k(1)])  # first turn
    store(policy, [k(0), k(1), k(2), k(3)])  # second turn: k(0), k(1) reused
    assert store(policy, [k(9)]) == [k(3)]
    assert store(policy, [k(9), k(10)]) == [k(2)]
    assert k(0) in policy and k(1) in policy


def test_a_batch_store_counts_its_own_chunks_toward_the_once_target() -> None:
    """Scenario: a conversation's four chunks are reused, a second one stores
    six, then a third stores six more in one batch (10 slots, once target 5).
    The new chunks join the once segment, so it is above its target after the
    store: the victims are the second conversation's once-seen chunks, as six
    stores of one chunk each would take, not the reused prefix (which a store
    that counted only the segment before it gave up, keeping no conversation
    whole when each first turn displaces the last: a loop longer than the tier)."""
    reused, second, third = (
        [k(i) for i in range(4)],
        [k(10 + i) for i in range(6)],
        [k(20 + i) for i in range(6)],
    )
    batch, single = SplitLRUPolicy(10), SplitLRUPolicy(10)
    for policy in (batch, single):
        store(policy, reused)
        policy.touch(reused)  # another request reuses them
        store(policy, second)
    assert sorted(store(batch, third, batch=True)) == sorted(second)
    one_by_one: list[OffloadKey] = []
    for key in third:
        victims = single.evict(1, [key], always)
        assert victims is not None
        one_by_one += victims
        single.insert(key)
    assert sorted(one_by_one) == sorted(second)
    assert all(key in batch and key in single for key in reused)


def test_a_chunk_stored_again_soon_after_eviction_counts_as_reused() -> None:
    """Scenario: a once-seen chunk is evicted, then another request stores it."""
    policy = SplitLRUPolicy(4)
    store(policy, [k(0)])
    for i in range(1, 5):
        store(policy, [k(i)])
    assert k(0) not in policy
    store(policy, [k(0)])  # a near miss: back into the reused segment
    for i in range(10, 13):
        store(policy, [k(i)])  # once-seen traffic takes once-seen victims first
    assert k(0) in policy


def test_the_split_follows_near_misses() -> None:
    """Scenario: every chunk comes back a few evictions after leaving: the once
    segment is too small, so its target grows."""
    policy = SplitLRUPolicy(64)
    before = policy.target_once
    for i in range(400):
        store(policy, [k(i)])
        if i >= 40:
            store(policy, [k(i - 40)])  # returns 40 requests later
    assert policy.target_once > before


def test_request_tails_that_are_never_reused_are_stored_cold() -> None:
    """Scenario: each request's last chunk is unique, its other chunks recur."""
    policy = SplitLRUPolicy(200)
    for turn in range(120):
        keys = [k(i) for i in range(turn % 10 * 3, turn % 10 * 3 + 3)]
        store(policy, [*keys, k(10_000 + turn)])
    # Once tails have been learned to be worthless, the newest one is the first
    # victim, ahead of older once-seen chunks.
    store(policy, [k(50_000), k(50_001)])
    assert policy.evict(1, [k(60_000)], always) == [k(50_001)]


def test_tails_reused_about_as_often_as_other_chunks_stay_warm() -> None:
    """Scenario: ten conversations grow by two chunks a turn and every turn returns,
    so a request's last chunk is reused as often as its others: no demotion."""
    policy = SplitLRUPolicy(1000)
    conversations = [[k(1000 * c)] for c in range(10)]
    for turn in range(12):
        for c, keys in enumerate(conversations):
            keys += [k(1000 * c + 2 * turn + 1), k(1000 * c + 2 * turn + 2)]
            store(policy, list(keys))
    older = conversations[0][-1]  # the first conversation's newest chunk
    store(policy, [k(50_000), k(50_001)])
    order = policy.evict(len(policy), [], always)
    assert order is not None
    assert order.index(older) < order.index(k(50_001))


def test_a_batch_learns_from_every_returning_run() -> None:
    """Scenario: two earlier requests' chunks were evicted at different times; a
    later request stores both prefixes again in one batch, then new chunks. Both
    returning runs count as reused: once-seen traffic does not evict them."""
    policy = SplitLRUPolicy(8)
    store(policy, [k(0), k(1)], batch=True)
    store(policy, [k(2), k(3)], batch=True)
    for i in range(100, 108):
        store(policy, [k(i)], batch=True)
    assert not any(k(i) in policy for i in range(4))
    store(policy, [k(0), k(1), k(2), k(3), k(50), k(51)], batch=True)
    for i in range(200, 204):
        store(policy, [k(i)], batch=True)
    assert all(k(i) in policy for i in range(4))
    assert k(50) not in policy and k(51) not in policy


def test_a_remembered_key_after_an_unknown_one_is_still_recognised() -> None:
    """Scenario: a batch starts with a key the history does not know, but a later
    key of it was evicted lately: that one is still a near miss (reused)."""
    policy = SplitLRUPolicy(4)
    store(policy, [k(1)], batch=True)
    for i in range(100, 104):
        store(policy, [k(i)], batch=True)
    assert k(1) not in policy
    store(policy, [k(500), k(1), k(501)], batch=True)
    for i in range(200, 203):
        store(policy, [k(i)], batch=True)
    assert k(1) in policy
    assert k(500) not in policy and k(501) not in policy


def test_clear_forgets_learned_state() -> None:
    policy = SplitLRUPolicy(8)
    for i in range(50):
        store(policy, [k(i), k(i + 1)])
    policy.clear()
    assert len(policy) == 0 and policy.target_once == 4.0
    store(policy, [k(3)])
    # k(3) was evicted before clear(), but nothing is remembered: once-seen.
    assert policy.evict(1, [], always) == [k(3)]


def test_ghost_history_forgets_the_oldest_generation() -> None:
    ghosts = GhostHistory(4, window=2)
    for i in range(6):
        ghosts.add_seen(k(i), now=i + 1)
    assert ghosts.pop(k(0)) is None and ghosts.pop(k(1)) is None
    found = ghosts.pop(k(5))
    assert found is not None and found & 3 == SEEN and found >> 2 == 6
    assert ghosts.pop(k(5)) is None  # popped once


def test_ghost_history_holds_its_size_plus_one_eviction_batch() -> None:
    """Scenario: batches of 7 evictions into a history of 30 keys. A generation
    ages after the batch that fills it, so the table holds up to 30 - 2 + 7
    keys, and the newest 15 to 30 are always remembered."""
    from collections import OrderedDict

    ghosts = GhostHistory(30, window=5)
    added: list[OffloadKey] = []
    for batch in range(20):
        keys = [k(7 * batch + i) for i in range(7)]
        segment: OrderedDict[OffloadKey, int] = OrderedDict(
            (key, stamp(batch + 1, ONCE)) for key in keys
        )
        ghosts.add_evicted(keys, segment, ONCE)
        added += keys
        assert len(ghosts) <= 30 - 2 + 7
    assert len(ghosts) >= 15
    assert all(ghosts.pop(key) is not None for key in added[-15:])


def test_ghost_distance_counts_evictions_since() -> None:
    from collections import OrderedDict

    ghosts = GhostHistory(100, window=10)
    segment: OrderedDict[OffloadKey, int] = OrderedDict(
        (k(i), stamp(i + 1, ONCE)) for i in range(6)
    )
    ghosts.add_evicted([k(0), k(1)], segment, ONCE)
    ghosts.add_evicted([k(2), k(3), k(4)], segment, ONCE)
    assert list(segment) == [k(5)]
    latest = ghosts.pop(k(4))
    first = ghosts.pop(k(0))
    assert latest is not None and first is not None
    assert ghosts.distance(latest) == 1
    assert ghosts.distance(first) == 4  # to within one batch of two
    assert ghosts.distance(stamp(3, SEEN)) is None


def test_controller_moves_toward_the_segment_with_more_near_misses() -> None:
    ghosts = GhostHistory(1000, window=100)
    from collections import OrderedDict

    segment: OrderedDict[OffloadKey, int] = OrderedDict(
        (k(i), stamp(1, REUSED)) for i in range(200)
    )
    ghosts.add_evicted(list(segment)[:200], segment, REUSED)  # reach for both
    once: OrderedDict[OffloadKey, int] = OrderedDict(
        (k(1000 + i), stamp(1, ONCE)) for i in range(200)
    )
    ghosts.add_evicted(list(once), once, ONCE)
    control = SplitController(100, window=100, epoch=1)
    for _ in range(10):
        control.near_miss(REUSED, 20)
        control.end_request(ghosts)
    assert control.target < 50
