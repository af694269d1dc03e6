"""Retention hints over every registered policy: hinted 0 first, then unhinted
chunks in the policy's order, then hinted ones (the longest hint first); an
expired hint is no hint; the bound on a tier's hinted share holds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.keys import OffloadKey
from kvoffload.policies import StopEviction, create_policy, policy_names
from kvoffload.policies.retention import RetentionPolicy, check_max_hinted_share

from .support import Clock, always, drain, k


def wrapped(
    name: str, capacity: int = 8, share: float = 1.0
) -> tuple[RetentionPolicy, Clock]:
    clock = Clock()
    return RetentionPolicy(create_policy(name, capacity), clock, share), clock


@pytest.mark.parametrize("name", policy_names())
def test_hinted_zero_go_first_then_unhinted_then_hinted(name: str) -> None:
    """Scenario: eight chunks; a prompt ending 6, 7 is hinted 0, 0 and 1 held
    for 60 s, 2 for 30 s; the rest carry no hint. Whatever the policy, the 0s
    go first (a prompt's end before its head: a hit is a leading run), then the
    unhinted ones, then the held ones, the longest hint first."""
    policy, _ = wrapped(name)
    for i in range(8):
        policy.insert(k(i))
    policy.retain([k(6), k(7)], 0)
    policy.retain([k(0), k(1)], 60)
    policy.retain([k(2)], 30)
    order = drain(policy)
    assert order[:2] == [k(7), k(6)]
    assert set(order[2:5]) == {k(3), k(4), k(5)}
    assert set(order[5:7]) == {k(0), k(1)} and order[7] == k(2)


@pytest.mark.parametrize("name", policy_names())
def test_without_hints_evict_is_the_policys_own(name: str) -> None:
    """Scenario: the same operations through a bare policy and a wrapped one
    that never saw a hint give the same victims, in the same order."""
    bare = create_policy(name, 8)
    policy, _ = wrapped(name)
    for p in (bare, policy):
        for i in (3, 1, 4, 0, 5, 2, 6, 7):
            p.insert(k(i))
        p.touch([k(0), k(1), k(2)])
    blocked = {k(4)}
    assert policy.evict(3, [k(9)], lambda key: key not in blocked) == bare.evict(
        3, [k(9)], lambda key: key not in blocked
    )
    assert drain(policy) == [bare.evict(1, [], always)[0] for _ in range(len(bare))]  # type: ignore[index]


@pytest.mark.parametrize("name", policy_names())
def test_an_expired_hint_is_no_hint(name: str) -> None:
    """Scenario: chunk 0 is held for 10 s and is the oldest; before the hint
    expires it outlives every other chunk, after it the policy alone decides."""
    policy, clock = wrapped(name)
    for i in range(4):
        policy.insert(k(i))
    policy.retain([k(0)], 10)
    assert policy.evict(1, [], always) != [k(0)]
    clock.now += 10
    assert policy.num_hinted() == 0
    assert policy.hint_of(k(0)) is None
    assert policy.counts.expired_unused == 1
    bare = create_policy(name, 8)
    for i in range(4):
        bare.insert(k(i))
    bare.evict(1, [], lambda key: key != k(0))
    assert policy.evict(1, [], always) == bare.evict(1, [], always)


@pytest.mark.parametrize("name", policy_names())
def test_the_bound_drops_the_longest_hints_first(name: str) -> None:
    """Scenario: a tier of 8 chunks may hold 4 under hints (share 0.5). Hints
    of 100 s on 0-1, 10 s on 2-3 and 50 s on 4-5: the 100 s ones stop counting
    and join the unhinted 6-7; of the held ones the 50 s hint goes first, its
    tail before its head."""
    policy, _ = wrapped(name, share=0.5)
    for i in range(8):
        policy.insert(k(i))
    policy.retain([k(0), k(1)], 100)
    policy.retain([k(2), k(3)], 10)
    policy.retain([k(4), k(5)], 50)
    assert policy.num_hinted() == 4
    assert policy.hint_of(k(0)) is None and policy.hint_of(k(1)) is None
    assert policy.counts.dropped == 2
    assert policy.hint_of(k(2)) == 10 and policy.hint_of(k(4)) == 50
    order = drain(policy)
    assert set(order[:4]) == {k(0), k(1), k(6), k(7)}
    assert order[4:] == [k(5), k(4), k(3), k(2)]


def test_a_longer_hint_extends_and_a_shorter_one_does_not_shorten() -> None:
    policy, clock = wrapped("lru")
    policy.insert(k(0))
    policy.retain([k(0)], 50)
    policy.retain([k(0)], 10)
    assert policy.hint_of(k(0)) == 50
    clock.now += 20
    policy.retain([k(0)], 40)
    assert policy.hint_of(k(0)) == 40


def test_covers_says_whether_a_retain_now_would_change_nothing() -> None:
    """Scenario: a bound of 2 chunks. Chunks 0 and 1 held for 60 s are covered
    by another 60 s hint at that instant (a request's touch after its store),
    not by a 30 s one, nor with chunk 2 beside them. Chunk 2's hint at the same
    instant passes the bound, and chunk 1, the oldest run's tail, stops
    counting: no longer covered; nor is a removed chunk, nor anything a moment
    later, nor a 0."""
    policy, clock = wrapped("lru", capacity=4, share=0.5)
    for i in range(4):
        policy.insert(k(i))
    policy.retain([k(0), k(1)], 60)
    assert policy.covers([k(0), k(1)], 60) and policy.covers([k(1)], 60)
    assert not policy.covers([k(0), k(1)], 30)
    assert not policy.covers([k(0), k(2)], 60)
    policy.retain([k(2)], 60)
    assert policy.hint_of(k(1)) is None and policy.hint_of(k(2)) == 60
    assert not policy.covers([k(1)], 60) and policy.covers([k(0), k(2)], 60)
    policy.retain([k(1)], 60)  # claimed again, so past the bound: chunk 0 stops
    assert policy.hint_of(k(1)) == 60 and policy.covers([k(1), k(2)], 60)
    policy.remove(k(2))
    assert not policy.covers([k(2)], 60) and not policy.covers([k(1)], 0)
    clock.now += 1
    assert not policy.covers([k(1)], 60)


def test_a_zero_ends_a_live_hint_and_a_load_ends_a_zero() -> None:
    """Scenario: chunks 0-1 are held for 60 s by a conversation's turn; its
    next turn loads them (the hint is honoured, once) and says 0 of 0-2. The
    tier has seen no 0 proven wrong, so it believes the 0 at once: the latest
    word stands, all three are hinted 0. Then chunk 1 is loaded: that 0
    was wrong, and it is unhinted again (not first to go). A later 60 s hint
    on chunk 2 ends its 0 as well: it goes last."""
    policy, _ = wrapped("lru")
    for i in range(4):
        policy.insert(k(i))
    policy.retain([k(0), k(1)], 60)
    assert policy.hint_of(k(0)) == 60
    policy.note_hit([k(0), k(1)])
    policy.note_hit([k(0)])
    assert policy.counts.honoured == 2
    policy.retain([k(0), k(1), k(2)], 0)
    assert [policy.hint_of(k(i)) for i in range(3)] == [0.0, 0.0, 0.0]
    policy.note_hit([k(1)])
    assert policy.hint_of(k(1)) is None
    policy.retain([k(2)], 60)
    assert policy.hint_of(k(2)) == 60
    assert drain(policy) == [k(0), k(1), k(3), k(2)]


@pytest.mark.parametrize("name", policy_names())
def test_a_zero_not_believed_at_once_leaves_an_earlier_hint_standing(
    name: str,
) -> None:
    """Scenario: this application's 0s on found chunks have been wrong (0 and
    1, found and said 0, were loaded again after two evictions). A turn holds
    6 and 7 for 60 s; the next turn, which found them, says 0: a 0 on found
    chunks is not believed at once here, so the earlier hint stands (had the 0
    been wrong, it would have cost the next turn its history)."""
    policy, _ = wrapped(name)
    for i in range(8):
        policy.insert(k(i))
    found = [k(0), k(1)]
    policy.retain(found, 0, stored=frozenset())
    for i in (8, 9):
        assert policy.evict(1, [k(i)], lambda key: key in (k(4), k(5))) is not None
        policy.insert(k(i))
    policy.note_hit(found)
    policy.retain([k(6), k(7)], 60)
    policy.retain([k(6), k(7)], 0, stored=frozenset())
    assert [policy.hint_of(k(6)), policy.hint_of(k(7))] == [60, 60]
    assert drain(policy)[-2:] == [k(7), k(6)]


@pytest.mark.parametrize("name", policy_names())
def test_a_zero_spares_the_prefix_other_requests_branch_from(name: str) -> None:
    """Scenario: chunks 0-1 are a system prompt; two requests found it and
    stored different chunks after it (2, then 3), so it ends a shared prefix. A
    last turn (0, 1, 4) says 0: only its own part, chunk 4, goes first. A
    conversation's history that never branched (5, 6, then 7 after them) is
    covered whole, its end first."""
    policy, _ = wrapped(name, capacity=16)
    for i in range(9):
        policy.insert(k(i))
    policy.retain([k(8)], 60)  # some request has sent a hint
    policy.touch([k(0), k(1), k(2)], {k(2)})
    policy.touch([k(0), k(1), k(3)], {k(3)})
    policy.touch([k(0), k(1), k(4)], {k(4)})
    policy.retain([k(0), k(1), k(4)], 0)
    assert [policy.hint_of(k(i)) for i in (0, 1, 4)] == [None, None, 0.0]
    policy.touch([k(5), k(6), k(7)], {k(7)})
    policy.retain([k(5), k(6), k(7)], 0)
    assert [policy.hint_of(k(i)) for i in (5, 6, 7)] == [0.0, 0.0, 0.0]
    assert drain(policy)[:4] == [k(4), k(7), k(6), k(5)]


def _learn_wrong_zeros(name: str, victims_back: bool) -> RetentionPolicy:
    """A tier of 8 chunks whose application's first 0s (chunks 0-3) are all
    loaded again after the tier evicted 2 other chunks (4 and 5, under no hint):
    wrong, at age 2. With `victims_back`, 4 and 5 are stored again too."""
    policy, _ = wrapped(name)
    for i in range(8):
        policy.insert(k(i))
    first = [k(0), k(1), k(2), k(3)]
    policy.retain(first, 0)
    for i in (8, 9):
        assert policy.evict(1, [k(i)], lambda key: key not in first) is not None
        policy.insert(k(i))
    policy.note_hit(first)
    assert policy.wrong_zero_rate == 1.0
    if victims_back:
        assert policy.evict(2, [k(4), k(5)], lambda key: key in first) is not None
        policy.insert_many([k(4), k(5)])
    return policy


@pytest.mark.parametrize("name", policy_names())
def test_zeros_proven_wrong_wait_until_they_outlive_the_proofs(name: str) -> None:
    """Scenario: the policy's victims are never asked for again, the 0s were
    all wrong at age 2. A new 0 on the newest chunk 9 is not believed: the
    policy's own victims go before it until it has outlived the age at which
    0s were proven wrong (4 evictions: ages are told apart by powers of two);
    then it goes first."""
    policy = _learn_wrong_zeros(name, victims_back=False)
    policy.retain([k(9)], 0)
    assert policy.hint_of(k(9)) == 0.0 and not policy.zero_believed(k(9))
    waited = 0
    for i in range(10, 18):
        if policy.zero_believed(k(9)):
            break
        victims = policy.evict(1, [k(i)], always)
        assert victims is not None and victims != [k(9)]
        waited += 1
        policy.insert(k(i))
    assert waited == 4
    assert policy.evict(1, [], always) == [k(9)]


@pytest.mark.parametrize("name", policy_names())
def test_zeros_wrong_no_more_often_than_the_policys_victims_go_first(
    name: str,
) -> None:
    """Scenario: as above, but the policy's victims were all stored again too:
    a 0 is no worse a bet than the chunk the policy would evict, so it is
    believed at once and goes first."""
    policy = _learn_wrong_zeros(name, victims_back=True)
    policy.retain([k(9)], 0)
    assert policy.zero_believed(k(9))
    assert policy.evict(1, [k(10)], always) == [k(9)]


@pytest.mark.parametrize("name", policy_names())
def test_zeros_never_proven_wrong_go_first_at_once(name: str) -> None:
    """Scenario: 0s whose chunks are never asked for again are believed at once,
    turn after turn: the application earns the trust it started with."""
    policy, _ = wrapped(name)
    for i in range(8):
        policy.insert(k(i))
    for i in range(8, 20):
        policy.retain([k(i - 1)], 0)
        assert policy.evict(1, [k(i)], always) == [k(i - 1)]
        policy.insert(k(i))
    assert policy.wrong_zero_rate == 0.0


@pytest.mark.parametrize("name", policy_names())
def test_zeros_on_found_chunks_are_judged_apart_from_zeros_on_own_ones(
    name: str,
) -> None:
    """Scenario: an application whose 0s on chunks a request found in the tier
    (a conversation's history) are wrong, and whose 0s on chunks a request
    stored itself (a one-shot document) are right. One request found 0 and 1
    and said 0 of them; another stored 2 and 3 and said 0; the tier evicted
    two unhinted chunks, then 0 and 1 were loaded again. The next 0 on a
    found chunk waits behind the policy's own victims; one on a chunk its
    request stored goes first at once."""
    policy, _ = wrapped(name)
    for i in range(8):
        policy.insert(k(i))
    found, own = [k(0), k(1)], [k(2), k(3)]
    policy.retain(found, 0, stored=frozenset())
    policy.retain(own, 0, stored=set(own))
    for i in (8, 9):
        victims = policy.evict(1, [k(i)], lambda key: key in (k(4), k(5)))
        assert victims is not None
        policy.insert(k(i))
    policy.note_hit(found)
    assert policy.wrong_zero_rate == 0.5
    assert policy.evict(2, [k(10), k(11)], always) == [k(3), k(2)]
    policy.insert_many([k(10), k(11)])
    policy.retain([k(6)], 0, stored=frozenset())
    policy.retain([k(7)], 0, stored={k(7)})
    assert not policy.zero_believed(k(6)) and policy.zero_believed(k(7))
    assert policy.evict(1, [k(12)], always) == [k(7)]
    assert policy.evict(1, [k(13)], always) != [k(6)]


def _zero_proven_wrong_by_a_store(name: str) -> RetentionPolicy:
    """A tier of 4 chunks, 0 to 3: chunk 0, hinted 0, is evicted first (for
    chunk 4); a later request needs it and stores it again (evicting chunk 1),
    which proves the 0 wrong even though no load saw it."""
    policy, _ = wrapped(name, capacity=4)
    for i in range(4):
        policy.insert(k(i))
    policy.retain([k(0)], 0)
    assert policy.evict(1, [k(4)], always) == [k(0)]
    policy.insert(k(4))
    assert policy.wrong_zero_rate == 0.0
    assert policy.evict(1, [k(0)], always) == [k(1)]
    policy.insert(k(0))
    assert policy.wrong_zero_rate == 1.0
    return policy


def test_a_zero_evicted_and_stored_again_was_wrong() -> None:
    """Scenario: chunk 0's 0 is proven wrong by a store of it again
    (`_zero_proven_wrong_by_a_store`); the next 0 on it is not believed at once
    (chunk 2, unhinted and older, goes before it)."""
    policy = _zero_proven_wrong_by_a_store("lru")
    policy.retain([k(0)], 0)
    assert not policy.zero_believed(k(0))
    assert policy.evict(1, [], always) == [k(2)]


def test_a_chunk_stored_again_after_a_wrong_zero_ranks_as_reused() -> None:
    """Scenario (ARC): chunk 0's 0 is proven wrong by a store of it again
    (`_zero_proven_wrong_by_a_store`), then a fresh chunk 5 comes. ARC hears
    the return as a reuse, as its ghosts would have told it of a victim it
    chose: chunk 0 is in T2, and the chunks seen once go before it. Before,
    chunk 0 came back as new and went before chunk 5."""
    policy = _zero_proven_wrong_by_a_store("arc")
    assert policy.evict(1, [k(5)], always) == [k(2)]
    policy.insert(k(5))
    assert drain(policy) == [k(3), k(4), k(5), k(0)]


@pytest.mark.parametrize("name", policy_names())
def test_stop_eviction_propagates_in_every_class_and_changes_nothing(name: str) -> None:
    """Scenario: the manager stops eviction at the storing request's own chunk
    (k(2), hinted 0 with k(3) after it: k(3) is offered first); the policy is
    unchanged afterwards."""
    policy, _ = wrapped(name)
    for i in range(6):
        policy.insert(k(i))
    policy.retain([k(2), k(3)], 0)
    policy.retain([k(0)], 30)

    def until_own(key: OffloadKey) -> bool:
        if key == k(2):
            raise StopEviction
        return True

    with pytest.raises(StopEviction):
        policy.evict(3, [k(9)], until_own)
    assert len(policy) == 6
    assert policy.hint_of(k(2)) == 0.0 and policy.hint_of(k(0)) == 30
    assert policy.evict(1, [], until_own) == [k(3)]


def _zeros_filling_every_eviction(name: str) -> tuple[RetentionPolicy, set[OffloadKey]]:
    """A tier of 40 chunks whose first 30 are hinted 0; two of them are loaded
    at once (wrong 0s, one in 15: more than one in 20), the rest never."""
    policy, _ = wrapped(name, capacity=40)
    for i in range(40):
        policy.insert(k(i))
    policy.retain([k(i) for i in range(30)], 0)
    policy.note_hit([k(28), k(29)])
    assert policy.wrong_zero_rate == 2 / 30
    return policy, {k(i) for i in range(28)}


@pytest.mark.parametrize("name", policy_names())
def test_the_policy_still_chooses_one_victim_in_twenty(name: str) -> None:
    """Scenario: believed 0s could fill every eviction, but what the policy's
    own victims are worth is read only from victims it chooses: after 20
    evictions of 0s the 21st is the policy's, then 0s again until none is
    left. (Where 0s are proven wrong less than one time in 20, they fill every
    eviction: `test_zeros_never_proven_wrong_go_first_at_once`.)"""
    policy, zeros = _zeros_filling_every_eviction(name)
    order = []
    for i in range(40, 71):
        victims = policy.evict(1, [k(i)], always)
        assert victims is not None
        order += victims
        policy.insert(k(i))
    assert [key in zeros for key in order] == [True] * 20 + [False] + [True] * 8 + [
        False
    ] * 2


@pytest.mark.parametrize("stop", [False, True])
@pytest.mark.parametrize("name", policy_names())
def test_a_policy_with_no_victim_to_give_leaves_the_eviction_to_a_zero(
    name: str, stop: bool
) -> None:
    """Scenario: at the 21st eviction the policy's turn comes, but nothing
    outside the 0s may go (refused, or the scan stopped at a store's own
    chunk): the 0 goes, as it would have."""
    policy, zeros = _zeros_filling_every_eviction(name)
    for i in range(40, 60):
        assert policy.evict(1, [k(i)], always) is not None
        policy.insert(k(i))

    def only_zeros(key: OffloadKey) -> bool:
        if key in zeros:
            return True
        if stop:
            raise StopEviction
        return False

    victims = policy.evict(1, [k(60)], only_zeros)
    assert victims is not None and victims[0] in zeros


def test_max_hinted_share_is_checked() -> None:
    assert check_max_hinted_share(0) == 0 and check_max_hinted_share(1) == 1
    for bad in (-0.1, 1.5, float("nan"), True, "0.5", None):
        with pytest.raises(ValueError, match="max_hinted_share"):
            check_max_hinted_share(bad)


def _cls(policy: RetentionPolicy, key: OffloadKey) -> int:
    hint = policy.hint_of(key)
    if hint == 0:  # a 0 not yet believed ranks as no hint
        return 1 if policy.zero_believed(key) else 2
    return 2 if hint is None else 3


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(policy_names()),
    ops=st.lists(
        st.tuples(
            st.sampled_from(
                ["insert", "retain", "zero", "tick", "evict", "remove", "hit"]
            ),
            st.integers(0, 20),
        ),
        max_size=150,
    ),
)
def test_random_operations_keep_the_order_and_the_bound(
    name: str, ops: list[tuple[str, int]]
) -> None:
    """Invariants: exactly `n` evictable victims or `None` and nothing changed;
    no victim of a class while an evictable chunk of an earlier class stays,
    but for the policy's own share (one victim of its own where believed 0s
    would fill an eviction, seldom); never more hinted chunks than the bound."""
    capacity = 10
    policy, clock = wrapped(name, capacity, share=0.4)
    blocked = {k(j) for j in range(0, 21, 5)}
    resident: set[OffloadKey] = set()
    evicted = explored = 0
    for op, i in ops:
        key = k(i)
        if op == "insert" and key not in resident and len(resident) < capacity:
            policy.insert(key)
            resident.add(key)
        elif op == "retain":
            policy.retain([r for r in (k(i), k(i + 1)) if r in resident], 1 + i % 7)
        elif op == "zero":
            policy.retain([key] if key in resident else [], 0)
        elif op == "tick":
            clock.now += i % 5
        elif op == "hit":
            policy.note_hit([key] if key in resident else [])
        elif op == "remove":
            policy.remove(key)
            resident.discard(key)
        elif op == "evict":
            before = {r: _cls(policy, r) for r in resident}
            victims = policy.evict(i % 4, [], lambda r: r not in blocked)
            if victims is None:
                assert {r: _cls(policy, r) for r in resident} == before
                continue
            assert len(victims) == i % 4 == len(set(victims))
            assert not set(victims) & blocked and set(victims) <= set(before)
            resident -= set(victims)
            evicted += len(victims)
            worst = max((before[v] for v in victims), default=0)
            left = [before[r] for r in resident if r not in blocked]
            if not all(c >= worst for c in left):
                # The policy's own share (`ZeroTrust.starved`): one unhinted
                # victim in an eviction believed 0s would have filled.
                assert worst == 2 and min(left) == 1, (victims, before)
                assert sum(before[v] == 2 for v in victims) == 1
                explored += 1
                assert explored * 10 <= evicted
        assert policy.num_hinted() <= int(0.4 * capacity)
        assert len(policy) == len(resident) and all(r in policy for r in resident)
