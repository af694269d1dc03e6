"""Whole chains: with `keep_chains`, host memory evicts only chunks that no
resident chunk continues, and refuses a store that would cut a chain."""

from __future__ import annotations

import pytest

from kvoffload import CPUOffloadingManager, OffloadKey, ReqContext, make_offload_key
from kvoffload.policies.lru import LRUPolicy
from kvoffload.replay.chat_rounds import ChatRounds, run_chat_rounds
from kvoffload.tiers.primary.chains import ChainLinks


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def keys(*ids: int) -> list[OffloadKey]:
    return [k(i) for i in ids]


def stored(m: CPUOffloadingManager, ids: list[int], success: bool = True) -> None:
    """Store `ids` (one prefix, in order) as a request that then finished."""
    ctx = ReqContext(f"earlier-{ids}")
    out = m.prepare_store(keys(*ids), ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx, success)
    m.on_request_finished(ctx)


def test_links_follow_the_offer_and_leave_with_the_chunk() -> None:
    links = ChainLinks()
    links.link(keys(1, 2, 3), set(keys(2, 3)))  # 1 was resident already
    assert [links.holds_back(key) for key in keys(1, 2, 3)] == [True, True, False]
    links.unlink(keys(3))
    assert [links.holds_back(key) for key in keys(1, 2)] == [True, False]
    links.unlink(keys(1))  # 2 is an orphan now: it continues nothing resident
    assert not links.holds_back(k(2))
    links.unlink(keys(2))
    assert not any(links.holds_back(key) for key in keys(1, 2, 3))


def test_a_prefix_several_chains_continue_is_not_held_back() -> None:
    """A system prompt (1) that two conversations continue (2, 3): the engine
    keeps it while either runs, so its host copy holds no chain's room."""
    links = ChainLinks()
    links.link(keys(1, 2), set(keys(1, 2)))
    assert links.holds_back(k(1))
    links.link(keys(1, 3), set(keys(3)))
    assert not links.holds_back(k(1))
    links.unlink(keys(3))
    assert links.holds_back(k(1))


def test_off_by_default_and_for_a_pool_smaller_than_the_engine_cache() -> None:
    """Without chains LRU gives up the chain's head (stored first), leaving 2-3
    behind a hole; with them, its end."""
    for on in (False, True):
        m = CPUOffloadingManager(3)
        if on:
            assert m.keep_chains(3) is False  # 3 chunks here, 3 in the engine
            assert m.keep_chains(2) is True
        stored(m, [1, 2, 3])
        out = m.prepare_store(keys(7), ReqContext("r"))
        assert out is not None and out.evicted_keys == (k(3) if on else k(1),)


def test_only_policies_that_give_up_a_chain_tail_first_keep_chains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A policy whose order is not a chain's tail first would find chain ends
    only among its newest chunks: it does not keep chains."""
    for policy in ("lru", "arc", "split"):
        assert CPUOffloadingManager(4, policy).keep_chains(3)
    monkeypatch.setattr(LRUPolicy, "chains_drain_from_tail", False)
    m = CPUOffloadingManager(3, "lru")
    assert not m.keep_chains(2)
    stored(m, [1, 2, 3])
    out = m.prepare_store(keys(7), ReqContext("r"))
    assert out is not None and out.evicted_keys == (k(1),)  # the head: no chains


def test_a_store_that_would_cut_a_chain_is_refused() -> None:
    """Scenario: a full pool of 3 holds the chain 1-2-3. A store of two new
    chunks needs two victims; only 3 ends the chain (1 and 2 continue into the
    next), so the store is refused and the chain stays whole."""
    m = CPUOffloadingManager(3)
    m.keep_chains(2)
    stored(m, [1, 2, 3])
    assert m.prepare_store(keys(7, 8), ReqContext("r")) is None
    assert all(m.holds(key) for key in keys(1, 2, 3))


def test_a_chain_whose_end_left_drains_from_its_new_end() -> None:
    m = CPUOffloadingManager(3)
    m.keep_chains(2)
    stored(m, [1, 2, 3])
    for new, victim in ((7, 3), (8, 2), (9, 1)):
        out = m.prepare_store(keys(new), ReqContext(f"r{new}"))
        assert out is not None and out.evicted_keys == (k(victim),)
        m.complete_store(out.keys_to_store, ReqContext(f"r{new}"))


def test_a_failed_store_and_a_reset_leave_no_chunk_held_by_a_link() -> None:
    m = CPUOffloadingManager(3)
    m.keep_chains(2)
    stored(m, [1, 2])
    stored(m, [1, 2, 3], success=False)  # 3 never became readable: 2 is an end
    out = m.prepare_store(keys(7, 8), ReqContext("r"))
    assert out is not None and out.evicted_keys == (k(2),)
    m.reset_cache()
    stored(m, [4, 5, 6])
    out = m.prepare_store(keys(9), ReqContext("s"))
    assert out is not None and out.evicted_keys == (k(6),)


def test_a_request_s_own_prefix_still_stops_the_scan() -> None:
    """Chains do not loosen the own-prefix rule: a request that loaded 1-2
    and stores 3-4 in a full pool is refused, not served from its own head."""
    m = CPUOffloadingManager(3)
    m.keep_chains(2)
    stored(m, [1, 2])
    stored(m, [5])
    ctx = ReqContext("r")
    m.prepare_load(keys(1, 2), ctx)
    m.complete_load(keys(1, 2), ctx)
    assert m.prepare_store(keys(1, 2, 3, 4), ctx) is None
    assert all(m.holds(key) for key in keys(1, 2, 5))


@pytest.mark.parametrize("policy", ["lru", "arc", "split"])
def test_conversations_taking_turns_keep_whole_chains_in_front_of_an_engine(
    policy: str,
) -> None:
    """Scenario (the peer tool's sizes): 8 conversations take 4 turns in
    round-robin order; 1,024-token first messages, 48-token messages; an engine
    prefix cache of 12 blocks; a host tier of 48 chunks, under half a round's
    chunks but larger than the engine's cache. Every store used to evict the
    conversation due next (LRU on a loop): no later turn hit, as with vLLM's
    connector. Keeping whole chains refuses the stores that would cut one, and
    the conversations the tier keeps hit on every later turn."""
    rounds = ChatRounds(conversations=8, turns=4, first_tokens=1024, message_tokens=48)
    result = run_chat_rounds(rounds, policy, 48, 12)
    assert result.later_hit_tokens >= 12_000
