"""ARC-specific behaviour: reuse promotes to T2, ghost hits adapt the target."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies import ARCPolicy, StopEviction, StopList


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def test_reused_chunks_outlive_a_scan() -> None:
    """Scenario: two chunks are reused, then a scan of one-time chunks passes by."""
    arc = ARCPolicy(4)
    for i in range(4):
        arc.insert(k(i))
    arc.touch([k(0), k(1)])
    for i in range(10, 20):
        victims = arc.evict(1, [k(i)], lambda _: True)
        assert victims is not None
        arc.insert(k(i))
    assert k(0) in arc and k(1) in arc


def test_touch_of_own_new_chunks_is_not_reuse() -> None:
    arc = ARCPolicy(2)
    arc.insert(k(0))
    arc.insert(k(1))
    arc.touch([k(0), k(1)], new=frozenset({k(0), k(1)}))
    # Both still in T1: the next eviction takes from T1 (the LRU one, k(1)).
    assert arc.evict(1, [k(2)], lambda _: True) == [k(1)]


def test_ghost_hit_in_b1_grows_the_t1_target() -> None:
    arc = ARCPolicy(2)
    arc.insert(k(0))
    arc.insert(k(1))
    arc.touch([k(1)])  # k(1) moves to T2
    assert arc.evict(1, [k(2)], lambda _: True) == [k(0)]
    arc.insert(k(2))
    before = arc.target_t1
    assert arc.evict(1, [k(0)], lambda _: True) is not None
    assert arc.target_t1 > before
    arc.insert(k(0))
    assert k(0) in arc


def _after_batch_with_ghost_tail() -> ARCPolicy:
    """ARC(3) after one store batch [new head k(4), ghost k(1) from B1], made
    when |T1| + |B1| = c. Textbook ARC, which sees the batch tail first, leaves
    T1 [3, 4], T2 [1], B1 [2], B2 [0] and p = 1."""
    arc = ARCPolicy(3)
    arc.insert(k(0))
    arc.insert(k(1))
    arc.touch([k(0)])  # T2 [0], T1 [1]
    arc.insert(k(2))
    assert arc.evict(1, [k(3)], lambda _: True) == [k(1)]
    arc.insert(k(3))  # T1 [2, 3], T2 [0], B1 [1]
    batch = [k(4), k(1)]
    assert arc.evict(2, batch, lambda _: True) == [k(2), k(0)]
    assert arc.target_t1 == 1
    arc.insert_many(batch)
    arc.touch(batch, new=frozenset(batch))
    return arc


def test_a_ghost_hit_stored_after_a_new_head_is_reused() -> None:
    """Scenario: a store batch's tail is a ghost hit from B1, its head new, with
    |T1| + |B1| = c; then a scan of new chunks passes by. The tail is reused
    (T2) and outlives the scan: inserting the head first must not trim the
    tail's own ghost from B1 and leave the tail in T1 as a new chunk."""
    arc = _after_batch_with_ghost_tail()
    for i in range(10, 16):
        assert arc.evict(1, [k(i)], lambda _: True) is not None
        arc.insert(k(i))
    assert k(1) in arc


def test_a_batch_with_a_ghost_tail_keeps_the_other_ghosts() -> None:
    """Scenario: after the same batch, the chunk evicted to B1 for it is stored
    again. Its ghost is still in B1, so the T1 target grows; inserting the
    batch's tail as new trimmed it from B1."""
    arc = _after_batch_with_ghost_tail()
    assert arc.evict(1, [k(2)], lambda _: True) is not None
    assert arc.target_t1 == 2


def _own(key: OffloadKey) -> Callable[[OffloadKey], bool]:
    """An `evictable` that stops at `key`, as the tier manager does at a storing
    request's own chunk."""

    def evictable(candidate: OffloadKey) -> bool:
        if candidate == key:
            raise StopList
        return True

    return evictable


def _t2_first() -> ARCPolicy:
    """T2: k(1), k(0), k(2); T1: k(4); a ghost hit set the target to 1, so T2
    goes first."""
    arc = ARCPolicy(4)
    for i in range(4):
        arc.insert(k(i))
    arc.touch([k(0), k(1)])  # T2: k(1), k(0); T1: k(2), k(3)
    assert arc.evict(1, [k(4)], lambda _: True) == [k(2)]
    arc.insert(k(4))
    # k(2) comes back from B1: the target grows to 1 and T1 gives k(3).
    assert arc.evict(1, [k(2)], lambda _: True) == [k(3)]
    arc.insert(k(2))
    return arc


def test_a_stop_at_the_front_of_t2_moves_the_target_to_t1() -> None:
    """Scenario: the target prefers T2, and T2's choice is a chunk the storing
    request loaded. The store is refused and nothing leaves, but the target
    moves as for a ghost hit in B2, so the next store takes from T1. Without
    that, a T2 holding little but a prompt every request loads stopped every
    store, and with no eviction the target never moved again."""
    arc = _t2_first()
    with pytest.raises(StopEviction):
        arc.evict(1, [k(5)], _own(k(1)))
    assert len(arc) == 4 and all(k(i) in arc for i in (0, 1, 2, 4))
    assert arc.evict(1, [k(5)], _own(k(1))) == [k(4)]


def test_a_stop_in_t1_after_t2_gave_nothing_leaves_the_target() -> None:
    """Scenario: the target prefers T2, but nothing in T2 may go (pinned, say),
    and T1's chunk is the storing request's own. The stop is T1's: the target
    stays, and T2 still goes first once its chunks may go."""
    arc = _t2_first()

    def t1_own(key: OffloadKey) -> bool:
        if key == k(4):
            raise StopList
        return False  # T2's chunks are in use

    with pytest.raises(StopEviction):
        arc.evict(1, [k(5)], t1_own)
    assert arc.evict(1, [k(5)], lambda _: True) == [k(1)]


def test_a_stop_at_the_front_of_t1_ends_the_scan() -> None:
    """Scenario: T1 goes first and its front is the storing request's own chunk:
    the request's touch will move it, so the stop ends the whole scan and the
    policy is unchanged."""
    arc = ARCPolicy(3)
    for i in range(3):
        arc.insert(k(i))
    arc.touch([k(0)])  # T2: k(0); T1: k(1), k(2)
    with pytest.raises(StopEviction):
        arc.evict(1, [k(3)], _own(k(1)))
    assert arc.evict(1, [k(3)], lambda _: True) == [k(1)]


def test_evictions_made_in_arcs_place_weigh_its_ghost_hits() -> None:
    """Scenario: two ARCs give up k(0) from T1 and find it again in B1. In one
    of them the tier also evicted k(1) and k(2) in ARC's place (believed 0s):
    ARC chose one victim of three, so its ghost hit stands for more and moves
    the target twice as far ((1 + 1 + 2) / (1 + 1): its own victim and a prior
    of one, against all three)."""
    targets = []
    for others in ([], [k(1), k(2)]):
        arc = ARCPolicy(4)
        for i in range(4):
            arc.insert(k(i))
        arc.touch([k(3)])  # T2 [3], T1 [0, 1, 2]
        assert arc.evict(1, [k(4)], lambda _: True) == [k(0)]
        arc.insert(k(4))
        arc.evicted_for(others)
        assert all(key not in arc for key in others)
        assert arc.evict(1, [k(0)], lambda _: True) is not None
        targets.append(arc.target_t1)
    assert targets == [1.0, 2.0]
