"""The room positive hints may hold follows what they are worth to the policy
they overrule: hits bought by chunks the policy would have given up, against
the policy's victims that come back (`HintWorth`)."""

from __future__ import annotations

from kvoffload.keys import OffloadKey
from kvoffload.policies import Refusing, create_policy
from kvoffload.policies.base import first_evictable
from kvoffload.policies.retention import RetentionPolicy

from .support import Clock, always, k

HINTED = [k(i) for i in range(10)]
UNHINTED = [k(100 + i) for i in range(10)]


def full_tier() -> tuple[RetentionPolicy, Clock]:
    """LRU over 20 chunks, hints bounded to half of it (10 chunks, floor 2):
    ten chunks held for 1,000 s at the cold end, ten unhinted ones after."""
    clock = Clock()
    policy = RetentionPolicy(create_policy("lru", 20), clock, 0.5)
    policy.insert_many(HINTED)
    policy.retain(HINTED, 1000)
    policy.insert_many(UNHINTED)
    return policy, clock


def evict_one(policy: RetentionPolicy) -> OffloadKey:
    victims = policy.evict(1, [], always)
    assert victims is not None and len(victims) == 1
    return victims[0]


def claim_again(policy: RetentionPolicy, clock: Clock) -> None:
    """A later request's claim: the bound is applied to the hints held."""
    clock.now += 1
    policy.retain([HINTED[0]], 1000)


def test_hints_whose_room_the_policy_wanted_back_shrink_to_the_floor() -> None:
    """Scenario: every store reads past the ten hinted chunks (the cold end of
    LRU's order) and evicts an unhinted one, which the next request stores
    again; no hinted chunk is ever loaded. After eight such returns the hints
    hold two chunks (the floor), and the next store takes a chunk whose hint
    stopped counting, not an unhinted one."""
    policy, clock = full_tier()
    for _ in range(8):
        victim = evict_one(policy)
        assert victim in UNHINTED
        policy.insert(victim)  # asked for again: a miss the hints caused
    claim_again(policy, clock)
    assert policy.num_hinted() == 2
    assert evict_one(policy) in HINTED


def test_hints_that_buy_hits_win_their_room_back() -> None:
    """Scenario: four victims come back (the hints' room shrinks to six
    chunks), then four hinted chunks that the scan read past are loaded while
    hinted: hits the policy would have missed. The hints hold all ten again,
    and the next store takes an unhinted chunk."""
    policy, clock = full_tier()
    for _ in range(4):
        policy.insert(evict_one(policy))
    for key in HINTED[:4]:
        policy.note_hit([key])
    claim_again(policy, clock)
    assert policy.num_hinted() == 10
    assert evict_one(policy) in UNHINTED


def test_hints_dropped_at_a_lowered_room_that_return_in_time_win_it_back() -> None:
    """Scenario: as in the first, the room falls to two chunks and a claim
    drops eight hints. The two still hinted are used again; six of the eight
    are evicted and asked for again before their deadline, as their hint said:
    hits a larger room would have kept. The room grows by six, and a claim of
    all ten keeps eight under a hint."""
    policy, clock = full_tier()
    for _ in range(8):
        policy.insert(evict_one(policy))
    claim_again(policy, clock)
    kept = [key for key in HINTED if policy.hint_of(key) is not None]
    assert len(kept) == 2
    policy.touch(kept)  # the scan meets the eight first, no hinted chunk
    for _ in range(6):
        victim = evict_one(policy)
        assert victim in HINTED and victim not in kept
        policy.insert(victim)
    clock.now += 1
    policy.retain(HINTED, 1000)
    assert policy.num_hinted() == 8


def test_hints_dropped_at_a_lowered_room_that_come_late_win_nothing() -> None:
    """Scenario: the same, but the eight come back after their deadline: the
    hint was wrong about them, and the room stays at two."""
    policy, clock = full_tier()
    for _ in range(8):
        policy.insert(evict_one(policy))
    claim_again(policy, clock)
    kept = [key for key in HINTED if policy.hint_of(key) is not None]
    policy.touch(kept)
    clock.now += 2000
    for _ in range(6):
        policy.insert(evict_one(policy))
    policy.retain(HINTED, 1000)
    assert policy.num_hinted() == 2


def test_loads_of_chunks_no_longer_hinted_buy_nothing() -> None:
    """Scenario: as in the first, then the hints expire and the chunks the scan
    had read past are loaded: no hint bought them, so the room stays at the
    floor for the next claims."""
    policy, clock = full_tier()
    for _ in range(8):
        policy.insert(evict_one(policy))
    clock.now += 2000  # every hint expired
    policy.note_hit(HINTED)
    policy.retain(HINTED, 1000)
    assert policy.num_hinted() == 2


def test_without_hints_the_order_is_the_policys() -> None:
    """No hint sent: stores of evicted chunks again change nothing; the bound
    applies in full to the first hints."""
    clock = Clock()
    policy = RetentionPolicy(create_policy("lru", 20), clock, 0.5)
    policy.insert_many(UNHINTED + HINTED)
    for _ in range(8):
        policy.insert(evict_one(policy))
    policy.retain(HINTED, 1000)
    assert policy.num_hinted() == 10


def test_a_scan_notes_only_the_held_keys_it_reads_past() -> None:
    """`Refusing` with `watched`: held keys are refused, in a scan and called
    alike, and noted only where the scan went past them."""
    keys = [k(1), k(90), k(91), k(2), k(92), k(3)]
    held = {k(90), k(91), k(92)}
    passed: set[OffloadKey] = set()
    refusing = Refusing([], always, watched=(held, passed))
    assert first_evictable(keys, 2, refusing) == [k(1), k(2)]
    assert passed == {k(90), k(91)}  # k(92) lies past the second victim
    assert not refusing(k(92))
    assert passed == held
    assert first_evictable(keys, 5, refusing) == [k(1), k(2), k(3)]
