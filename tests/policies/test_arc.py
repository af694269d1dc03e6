"""ARC-specific behaviour: reuse promotes to T2, ghost hits adapt the target."""

from __future__ import annotations

from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies import ARCPolicy


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
