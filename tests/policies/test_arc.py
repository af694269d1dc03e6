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
