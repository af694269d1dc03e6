"""The floor the manager benchmark times retention hints against
(`bench.hint_floor.BareHints`): the three classes of `RetentionPolicy`, and
nothing learned."""

from __future__ import annotations

import pytest

from kvoffload.bench.hint_floor import BareHints
from kvoffload.policies import create_policy, policy_names

from ..policies.support import Clock, always, drain, k


def bare(name: str, capacity: int = 8, share: float = 1.0) -> tuple[BareHints, Clock]:
    clock = Clock()
    return BareHints(create_policy(name, capacity), clock, share), clock


@pytest.mark.parametrize("name", policy_names())
def test_zeros_go_first_then_unhinted_then_hinted(name: str) -> None:
    """Scenario: 0..5 stored in order; 1, 2 hinted for a minute, 3, 4 (one
    prefix) hinted 0. The 0s leave first, from the end of their prefix back,
    then 0 and 5 in the policy's own order, then the hinted ones."""
    policy, _ = bare(name)
    policy.insert_many([k(i) for i in range(6)])
    policy.retain([k(1), k(2)], 60)
    policy.retain([k(3), k(4)], 0)
    order = drain(policy)
    assert order[:2] == [k(4), k(3)]
    assert set(order[2:4]) == {k(0), k(5)}
    assert set(order[4:]) == {k(1), k(2)}


def test_an_expired_hint_is_no_hint_and_a_load_ends_a_zero() -> None:
    """Scenario (LRU): 0 hinted for 10 s, 1 hinted 0 then loaded. Past the
    deadline 0 is the oldest chunk under no hint and goes first; 1, its 0
    proven wrong by the load, is an ordinary chunk again."""
    policy, clock = bare("lru")
    policy.insert_many([k(0), k(1), k(2)])
    policy.retain([k(0)], 10)
    policy.retain([k(1)], 0)
    policy.note_hit([k(1)])
    assert policy.hint_of(k(1)) is None and policy.hint_of(k(0)) == 10
    assert policy.evict(1, [], always) == [k(1)]
    clock.now += 11
    assert policy.hint_of(k(0)) is None
    assert policy.evict(1, [], always) == [k(0)]


def test_past_the_bound_the_oldest_claim_stops_counting() -> None:
    """Scenario (LRU, room for 2 hinted chunks of 8): claims on 0, then 1,
    then 2. The first stops counting: 0 is under no hint and leaves first."""
    policy, clock = bare("lru", share=0.25)
    policy.insert_many([k(i) for i in range(4)])
    for i in range(3):
        clock.now += 1
        policy.retain([k(i)], 60)
    assert policy.num_hinted() == 2 and policy.hint_of(k(0)) is None
    assert policy.evict(2, [], always) == [k(0), k(3)]
