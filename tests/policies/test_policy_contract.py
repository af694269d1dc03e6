"""The EvictionPolicy contract, run against every registered policy."""

from __future__ import annotations

import re
from itertools import count

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies import (
    EvictionPolicy,
    Refusing,
    StopEviction,
    create_policy,
    get_policy_class,
    policy_names,
)


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def always(_: OffloadKey) -> bool:
    return True


@pytest.fixture(params=policy_names())
def policy(request: pytest.FixtureRequest) -> EvictionPolicy:
    return create_policy(request.param, 8)


def test_builtin_policies_are_registered() -> None:
    assert {"lru", "arc"} <= set(policy_names())


def test_insert_contains_len_remove(policy: EvictionPolicy) -> None:
    for i in range(5):
        policy.insert(k(i))
    assert len(policy) == 5
    assert all(k(i) in policy for i in range(5))
    policy.remove(k(2))
    policy.remove(k(99))  # unknown: ignored
    assert k(2) not in policy and len(policy) == 4


def test_evict_returns_exactly_n_resident_evictable_keys(
    policy: EvictionPolicy,
) -> None:
    for i in range(8):
        policy.insert(k(i))
    blocked = {k(0), k(1), k(2)}
    victims = policy.evict(3, [k(100)], lambda key: key not in blocked)
    assert victims is not None and len(victims) == 3 == len(set(victims))
    assert not set(victims) & blocked
    assert all(v not in policy for v in victims)
    assert len(policy) == 5


def test_evict_is_all_or_nothing(policy: EvictionPolicy) -> None:
    for i in range(8):
        policy.insert(k(i))
    evictable = {k(0), k(1)}
    assert policy.evict(3, [k(100)], evictable.__contains__) is None
    assert len(policy) == 8 and all(k(i) in policy for i in range(8))
    assert policy.evict(0, [], always) == []


def test_stop_eviction_ends_the_scan_and_changes_nothing(
    policy: EvictionPolicy,
) -> None:
    """Scenario: the tier manager raises `StopEviction` at the first chunk of the
    storing request's own (k(5)): the policy asks in its order of preference, so
    every candidate it was asked about before k(5) is one it would give up first;
    the stop propagates and the policy is unchanged, as after a `None`."""
    for i in range(8):
        policy.insert(k(i))
    asked: list[OffloadKey] = []

    def until_own(key: OffloadKey) -> bool:
        asked.append(key)
        if key == k(5):
            raise StopEviction
        return True

    with pytest.raises(StopEviction):
        policy.evict(8, [k(100)], until_own)
    assert asked[-1] == k(5) and len(asked) == len(set(asked))
    assert len(policy) == 8 and all(k(i) in policy for i in range(8))
    before = policy.evict(len(asked) - 1, [k(100)], always)
    assert before is not None and set(before) == set(asked[:-1])


def test_touch_keeps_the_head_of_a_prefix_longest(policy: EvictionPolicy) -> None:
    """Scenario: one request reuses a 4-chunk prefix inserted in another order;
    then pressure evicts everything, one chunk at a time. Within the prefix the
    tail goes first and the head last, whatever the order of insertion."""
    for i in (2, 0, 3, 1, 4, 5, 6, 7):
        policy.insert(k(i))
    prefix = [k(0), k(1), k(2), k(3)]
    policy.touch(prefix)
    policy.touch([k(50)])  # unknown keys are ignored
    order: list[OffloadKey] = []
    while len(policy):
        victims = policy.evict(1, [], always)
        assert victims is not None and len(victims) == 1
        order += victims
    assert [key for key in order if key in prefix] == prefix[::-1]
    assert k(50) not in order


def test_clear_forgets_everything(policy: EvictionPolicy) -> None:
    for i in range(8):
        policy.insert(k(i))
    policy.clear()
    assert len(policy) == 0 and k(0) not in policy
    assert policy.evict(1, [], always) is None


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(policy_names()),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["insert", "touch", "evict", "remove"]), st.integers(0, 30)
        ),
        max_size=120,
    ),
)
def test_random_operations_keep_the_contract(
    name: str, ops: list[tuple[str, int]]
) -> None:
    capacity = 10
    policy = create_policy(name, capacity)
    blocked = {k(j) for j in range(0, 31, 2)}

    def unblocked(key: OffloadKey) -> bool:
        return key not in blocked

    resident: set[OffloadKey] = set()
    clock = -1
    for op, i in ops:
        key = k(i)
        if op == "insert" and key not in resident:
            if len(resident) >= capacity:
                victims = policy.evict(1, [key], always)
                assert victims is not None
                resident -= set(victims)
            policy.insert(key)
            resident.add(key)
        elif op == "touch":
            policy.touch([k(j) for j in range(i, i + 3)], new=frozenset({key}))
        elif op == "evict":
            before = set(resident)
            victims = policy.evict(i % 4, [], unblocked)
            if victims is None:
                assert resident == before
            else:
                assert len(victims) == i % 4 and not set(victims) & blocked
                assert set(victims) <= before
                resident -= set(victims)
        elif op == "remove":
            policy.remove(key)
            resident.discard(key)
        assert len(policy) == len(resident)
        assert all(r in policy for r in resident)
        # A clock of uses, where the policy keeps one, only grows; no chunk was
        # used after it, and a chunk it does not hold has no use.
        now = policy.use_clock
        probe = [k(j) for j in range(0, 31, 3)]
        uses = [policy.last_use(p) for p in probe]
        assert policy.latest_use(probe) == max(uses)
        if now is None:
            assert set(uses) == {-1}
            continue
        assert now >= clock
        clock = now
        assert all(
            u == -1 for p, u in zip(probe, uses, strict=True) if p not in resident
        )
        assert all(
            0 <= u <= now for p, u in zip(probe, uses, strict=True) if p in resident
        )


def test_registry_loads_a_policy_from_an_import_path() -> None:
    assert get_policy_class("kvoffload.policies.lru:LRUPolicy") is get_policy_class(
        "lru"
    )
    assert get_policy_class("kvoffload.policies.arc.ARCPolicy") is get_policy_class(
        "arc"
    )


@pytest.mark.parametrize(
    "name", ["mru", "", "kvoffload.policies.lru:Nope", "kvoffload.keys:OffloadKey"]
)
def test_unknown_policy_names_raise_with_the_choices(name: str) -> None:
    with pytest.raises(ValueError, match="eviction_policy"):
        get_policy_class(name)


@pytest.mark.parametrize("name", ["..x", ".x", ":x", ".", "x..y:Z", "os:"])
def test_a_malformed_import_path_raises_a_value_error_naming_it(name: str) -> None:
    """Scenario: a relative or empty module name, which `importlib` refuses with
    a TypeError or a ValueError that does not name the value."""
    with pytest.raises(
        ValueError,
        match=rf"eviction_policy: cannot import {re.escape(repr(name))}.*"
        r"expected one of \['arc', 'lru', 'split'\] or an import path",
    ):
        get_policy_class(name)


@pytest.mark.parametrize(
    "name", ["kvoffload.policies.base:EvictionPolicy", "collections:OrderedDict"]
)
def test_an_import_path_to_no_usable_policy_is_refused_naming_it(name: str) -> None:
    """Scenario: the path names the abstract base class (which would pass a
    subclass check, then fail when the tier is built) or a class that is no
    policy at all: start-up refuses it, naming the value."""
    with pytest.raises(ValueError, match=rf"{re.escape(repr(name))} is not a concrete"):
        get_policy_class(name)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        create_policy("lru", 0)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(policy_names()),
    ops=st.lists(
        st.tuples(st.sampled_from(["insert", "touch", "evict"]), st.integers(0, 30)),
        max_size=120,
    ),
    refused=st.sets(st.integers(0, 30)),
)
def test_a_refusing_evictable_takes_what_the_same_plain_check_takes(
    name: str, ops: list[tuple[str, int]], refused: set[int]
) -> None:
    """Scenario: a wrapper sets chunks aside (`Refusing`, as `RetentionPolicy`
    does hinted ones). Two copies of a policy see the same operations; one is
    asked through a `Refusing`, the other through a plain check that refuses
    the same keys: the victims are the same, the `Refusing`'s own check is
    never asked about a key it refuses outright, and its tally counts the keys
    that check accepted, whether the policy scans in C or calls it."""
    plain, refusing = create_policy(name, 10), create_policy(name, 10)
    aside = {k(j) for j in refused}
    blocked = {k(j) for j in range(0, 31, 3)}
    asked: list[OffloadKey] = []
    accepted: list[OffloadKey] = []

    def accept(key: OffloadKey) -> bool:
        asked.append(key)
        if key in blocked:
            return False
        accepted.append(key)
        return True

    def check(key: OffloadKey) -> bool:
        return key not in aside and key not in blocked

    for op, i in ops:
        for policy in (plain, refusing):
            if op == "insert" and k(i) not in policy and len(policy) < 10:
                policy.insert(k(i))
            elif op == "touch":
                policy.touch([k(i), k(i + 1)])
        if op == "evict":
            want = plain.evict(1 + i % 3, [k(100 + i)], check)
            tally, before = count(), len(accepted)
            refusing_check = Refusing([aside], accept, tally)
            got = refusing.evict(1 + i % 3, [k(100 + i)], refusing_check)
            assert got == want
            assert next(tally) == len(accepted) - before
    assert not aside & set(asked)


def test_remove_many_is_remove_of_each_key(policy: EvictionPolicy) -> None:
    """Scenario: two copies of a policy get the same chunks and touches; one
    removes some chunks (and an unknown key) one call each, the other in one
    call. Both then hold the same chunks and give them up in the same order."""
    twin = create_policy(policy.name, 8)
    for each in (policy, twin):
        each.insert_many([k(i) for i in range(8)])
        each.touch([k(i) for i in range(0, 8, 3)])
    gone = [k(i) for i in (2, 3, 7, 40)]
    for key in gone:
        policy.remove(key)
    twin.remove_many(gone)
    assert len(policy) == len(twin) == 5
    assert policy.evict(5, [], always) == twin.evict(5, [], always)
