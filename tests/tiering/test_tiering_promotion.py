"""TieringManager promotions: secondary hits loaded into the primary tier."""

from __future__ import annotations

from kvoffload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadPolicy,
    PrefixLookup,
    ReqContext,
)
from kvoffload.tiering import TieringConfig, TieringManager
from kvoffload.tiers.secondary import ArrayChunkBuffer
from tests.tiering.tiering_support import (
    SLOT,
    Clock,
    HeldTier,
    key,
    keys,
    make_manager,
    payload,
)

R1 = ReqContext("r1")


def seeded_tier(buf: ArrayChunkBuffer, ids: list[int], **kwargs: object) -> HeldTier:
    """A tier that already holds chunks `ids` (stored by another engine)."""
    tier = HeldTier(buf, **kwargs)  # type: ignore[arg-type]
    for k in keys(*ids):
        tier.chunks[k] = payload(k, SLOT)
    return tier


def test_secondary_hit_is_promoted_and_pending_until_it_lands() -> None:
    """Scenario: a chunk only in the secondary tier reads HIT_PENDING while it is
    loaded into the primary tier, then HIT, and the engine gets its bytes."""
    buf = ArrayChunkBuffer(4, SLOT)
    tier = seeded_tier(buf, [1], auto=False)
    m, engine = make_manager([tier], buffer=buf, num_chunks=4)
    m.on_new_request(R1)
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    engine.step()  # the load is submitted at the end of the step
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    tier.release()
    engine.step()
    assert m.lookup(key(1), R1) is LookupResult.HIT
    engine.load(keys(1), R1)
    assert [kind for kind, _ in tier.calls if kind == "load"] == ["load"]


def test_prefix_lookup_promotes_a_short_prefix_in_one_job() -> None:
    """Scenario: chunk 1 in the primary tier, chunks 2-3 in the secondary tier,
    chunk 4 nowhere: the prefix is present up to 3, promoted in one load job."""
    buf = ArrayChunkBuffer(8, SLOT)
    tier = seeded_tier(buf, [2, 3])
    m, engine = make_manager([tier], buffer=buf, num_chunks=8)
    m.on_new_request(R1)
    engine.store(keys(1), ReqContext.create("w", {"kv_store_tiers": []}))
    assert m.lookup_prefix(keys(1, 2, 3, 4), R1) == PrefixLookup(1, 3)
    assert [ks for kind, ks in tier.calls if kind == "load"] == [(key(2), key(3))]
    engine.step()
    assert m.lookup_prefix(keys(1, 2, 3, 4), R1) == PrefixLookup(3, 3)
    engine.load(keys(1, 2, 3), R1)


def test_a_long_prefix_is_promoted_head_first_in_growing_jobs() -> None:
    """Scenario: 20 chunks of a prefix are only on disk. The promotion goes out
    as jobs of 4, 8 and 8 chunks in prefix order; once the first has landed the
    head reads HIT while the tail is still pending, so a request whose deferral
    ends then loads its head instead of nothing."""
    buf = ArrayChunkBuffer(32, SLOT)
    ids = list(range(1, 21))
    tier = seeded_tier(buf, ids, auto=False)
    m, engine = make_manager([tier], buffer=buf, num_chunks=32)
    m.on_new_request(R1)
    assert m.lookup_prefix(keys(*ids), R1) == PrefixLookup(0, 20)
    engine.step()
    jobs = [ks for kind, ks in tier.calls if kind == "load"]
    assert jobs == [
        tuple(keys(*ids[:4])),
        tuple(keys(*ids[4:12])),
        tuple(keys(*ids[12:])),
    ]
    tier.release(1)
    engine.step()
    assert m.lookup_prefix(keys(*ids), R1) == PrefixLookup(4, 20)
    engine.load(keys(*ids[:4]), R1)
    tier.release()
    engine.step()
    assert m.lookup_prefix(keys(*ids), R1) == PrefixLookup(20, 20)


def test_a_promotion_in_one_job_when_batches_are_off() -> None:
    buf = ArrayChunkBuffer(32, SLOT)
    ids = list(range(1, 21))
    tier = seeded_tier(buf, ids)
    primary = CPUOffloadingManager(32)
    m = TieringManager(primary, [tier], TieringConfig(promotion_first_batch=0))
    m.on_new_request(R1)
    m.lookup_prefix(keys(*ids), R1)
    m.on_schedule_end()
    assert [ks for kind, ks in tier.calls if kind == "load"] == [tuple(keys(*ids))]


def test_failed_promotion_frees_its_slot_and_misses_without_retrying() -> None:
    """Scenario: the tier claims a chunk but its load fails: the primary slot is
    freed, the next lookups miss (no second load), and after the failure memory
    expires a lookup tries again."""
    buf = ArrayChunkBuffer(4, SLOT)
    tier = seeded_tier(buf, [1])
    tier.fail_loads = True
    clock = Clock()
    m, engine = make_manager([tier], buffer=buf, num_chunks=4, clock=clock)
    m.on_new_request(R1)
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    engine.step()
    for _ in range(3):
        assert m.lookup(key(1), R1) is LookupResult.MISS
        engine.step()
    assert m.primary.num_free_slots() == 4
    assert len([c for c in tier.calls if c[0] == "load"]) == 1
    clock.advance(m.config.promotion_failure_ttl_s + 1)
    tier.fail_loads = False
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    engine.step()
    assert m.lookup(key(1), R1) is LookupResult.HIT
    engine.load(keys(1), R1)


def test_failed_promotion_is_a_failure_of_its_source_tier_only() -> None:
    """Scenario: a chunk's load from the secondary tier fails: the failure counts
    for that tier, not for host memory, which only reserved a slot for it (SPEC
    §3.10: per-tier failures)."""
    buf = ArrayChunkBuffer(4, SLOT)
    tier = seeded_tier(buf, [1])
    tier.fail_loads = True
    m, engine = make_manager([tier], buffer=buf, num_chunks=4)
    m.on_new_request(R1)
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    engine.step()
    assert m.lookup(key(1), R1) is LookupResult.MISS
    stats = m.get_stats()
    assert stats["held"].failures == 1
    assert (stats["cpu"].failures, stats["cpu"].occupancy) == (0, 0)


def test_promoted_chunk_loaded_by_its_request_is_reuse_not_its_own_store() -> None:
    """Scenario: host memory (ARC, two slots) misses chunk 1, which the secondary
    tier holds; r1's lookup promotes it and r1 loads and touches it. Another
    request stored it, so the touch counts as reuse (SPEC §3.2): when two chunks
    seen once follow, ARC evicts one of them, not chunk 1."""
    buf = ArrayChunkBuffer(2, SLOT)
    tier = seeded_tier(buf, [1])
    m, engine = make_manager([tier], buffer=buf, num_chunks=2, eviction_policy="arc")
    m.on_new_request(R1)
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    engine.step()
    assert m.lookup(key(1), R1) is LookupResult.HIT
    engine.load(keys(1), R1)
    m.touch(keys(1), R1)
    w = ReqContext.create("w", {"kv_store_tiers": []})
    engine.store(keys(2), w)
    out = m.prepare_store(keys(3), ReqContext.create("w2", {"kv_store_tiers": []}))
    assert out is not None and out.evicted_keys == (key(2),)


def test_promotion_into_a_full_primary_with_nothing_evictable_misses() -> None:
    """Scenario: every primary slot is pinned by a load: a secondary hit cannot be
    promoted and answers MISS (not an endless HIT_PENDING)."""
    buf = ArrayChunkBuffer(2, SLOT)
    tier = seeded_tier(buf, [9])
    m, engine = make_manager([tier], buffer=buf, num_chunks=2)
    m.on_new_request(R1)
    engine.store(keys(1, 2), ReqContext.create("w", {"kv_store_tiers": []}))
    m.prepare_load(keys(1, 2), R1)
    assert m.lookup(key(9), R1) is LookupResult.MISS
    m.complete_load(keys(1, 2), R1)
    assert m.lookup(key(9), R1) is LookupResult.HIT_PENDING


def test_load_tier_filter_by_medium_locality_and_name() -> None:
    """Scenario: kv_load_tiers picks which tiers a request reads: by medium
    (storage), by locality (remote) or by name; excluded tiers are not asked."""
    cases = [
        (["storage"], {1}),
        (["remote"], {2}),
        (["shared"], {2}),
        (["cpu:remote", "disk"], {1, 2}),
        ([], set()),
    ]
    for n, (selector, readable) in enumerate(cases):
        buf = ArrayChunkBuffer(8, SLOT)  # each selector starts cold
        disk = seeded_tier(buf, [1], name="disk", medium="storage", locality="local")
        shared = seeded_tier(buf, [2], name="shared", medium="cpu", locality="remote")
        m, _ = make_manager([disk, shared], buffer=buf, num_chunks=8)
        ctx = ReqContext.create(f"q{n}", {"kv_load_tiers": selector})
        m.on_new_request(ctx)
        found = {i for i in (1, 2) if m.lookup(key(i), ctx) is not LookupResult.MISS}
        assert found == readable, selector


def test_secondary_tiers_are_asked_in_order_and_first_hit_wins() -> None:
    buf = ArrayChunkBuffer(4, SLOT)
    near = seeded_tier(buf, [1], name="near")
    far = seeded_tier(buf, [1], name="far")
    m, engine = make_manager([near, far], buffer=buf, num_chunks=4)
    m.on_new_request(R1)
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    engine.step()
    assert [c[0] for c in near.calls].count("load") == 1
    assert [c[0] for c in far.calls].count("load") == 0


def test_promoted_chunk_is_not_cascaded_back() -> None:
    buf = ArrayChunkBuffer(4, SLOT)
    tier = seeded_tier(buf, [1])
    m, engine = make_manager([tier], buffer=buf, num_chunks=4)
    m.on_new_request(R1)
    engine.lookup_until_known(key(1), R1)
    assert tier.stored_keys() == []


def test_reset_empties_every_tier_after_waiting_for_running_jobs() -> None:
    """Scenario: reset while a cascade is held: reset drains it first (its
    slot is not reused under it), then empties the secondary tier too, so
    neither the drained chunk nor an older one comes back; a late completion
    of an old store is ignored; a chunk stored afterwards cascades as before."""
    buf = ArrayChunkBuffer(4, SLOT)
    tier = seeded_tier(buf, [3], auto=False)
    m, engine = make_manager([tier], buffer=buf, num_chunks=4)
    m.on_new_request(R1)
    engine.store(keys(1), R1)
    engine.store(keys(2), R1, complete=False)
    m.reset_cache()
    assert tier.held == [] and tier.chunks == {}
    assert ("reset", 2) in tier.calls  # 1 (drained) and 3 were dropped
    m.complete_store(keys(2), R1)  # late completion of a job from before the reset
    assert m.primary.num_free_slots() == 4
    tier.auto = True
    for k in keys(1, 2, 3):
        assert engine.lookup_until_known(k, R1) is LookupResult.MISS
    engine.store(keys(4), R1)
    engine.settle()
    assert key(4) in tier.chunks


def test_a_promotion_never_evicts_the_prefix_its_lookup_counted() -> None:
    """Scenario: the primary tier is full and chunk 1, the oldest, heads a
    request whose chunk 3 is in the secondary tier. Making room for 3 takes
    chunk 2, not chunk 1, which the lookup has just counted as a hit (the
    engine would then load a chunk that is gone)."""
    buf = ArrayChunkBuffer(2, SLOT)
    tier = seeded_tier(buf, [3])
    m, engine = make_manager([tier], buffer=buf, num_chunks=2)
    no_cascade = {"kv_store_tiers": []}
    engine.store(keys(1), ReqContext.create("w1", no_cascade))
    engine.store(keys(2), ReqContext.create("w2", no_cascade))
    m.on_new_request(R1)
    assert m.lookup_prefix(keys(1, 3), R1) == PrefixLookup(1, 2)
    assert m.lookup(key(1), R1) is LookupResult.HIT
    assert m.lookup(key(2), R1) is LookupResult.MISS
    engine.step()
    engine.load(keys(1, 3), R1)


def test_hit_tokens_go_to_the_tier_a_requests_lookup_found_the_chunks_in() -> None:
    """Scenario: chunk 1 is in the primary tier, chunk 2 only in the secondary
    tier. R1's lookup promotes chunk 2: R1's load credits the secondary tier for
    chunk 2 and the primary for chunk 1. R2 then finds both in the primary tier,
    and a second load by R1 (after a preemption) too: both credit the primary."""
    buf = ArrayChunkBuffer(8, SLOT)
    tier = seeded_tier(buf, [2])
    m, engine = make_manager([tier], buffer=buf, num_chunks=8)
    engine.store(keys(1), ReqContext.create("w", {"kv_store_tiers": []}))
    r2 = ReqContext("r2")
    for ctx in (R1, r2):
        m.on_new_request(ctx)
    assert m.lookup_prefix(keys(1, 2), R1) == PrefixLookup(1, 2)
    engine.step()
    assert m.lookup_prefix(keys(1, 2), r2) == PrefixLookup(2, 2)
    for ctx, tokens in ((R1, 16), (r2, 16), (R1, 8)):
        m.prepare_load(keys(1, 2), ctx)
        m.on_load_planned({key(1): tokens, key(2): tokens}, ctx)
        m.complete_load(keys(1, 2), ctx)
    stats = m.get_stats()
    assert stats["held"].hit_tokens == 16
    assert stats["cpu"].hit_tokens == 16 + 2 * 16 + 2 * 8


def test_promoted_chunk_is_cascaded_to_the_tiers_ahead_of_its_source() -> None:
    """Scenario: tiers near (empty) and far (holding chunk 1, stored by another
    engine). A lookup promotes 1 from far; when it lands it is copied into near
    (far is not written again). After host memory evicts it, a request that
    reads only near still finds it, with the engine's bytes."""
    buf = ArrayChunkBuffer(4, SLOT)
    near = HeldTier(buf, name="near")
    far = seeded_tier(buf, [1], name="far")
    m, engine = make_manager([near, far], buffer=buf, num_chunks=4)
    m.on_new_request(R1)
    assert engine.lookup_until_known(key(1), R1) is LookupResult.HIT
    engine.settle()
    assert near.stored_keys() == [key(1)]
    assert far.stored_keys() == []
    engine.store(keys(2, 3, 4, 5), ReqContext.create("w", {"kv_store_tiers": []}))
    assert m.primary.lookup(key(1), R1) is LookupResult.MISS  # evicted from host
    near_only = ReqContext.create("r2", {"kv_load_tiers": ["near"]})
    m.on_new_request(near_only)
    assert engine.lookup_until_known(key(1), near_only) is LookupResult.HIT
    engine.load(keys(1), near_only)


def test_promoted_chunk_cascade_follows_the_store_tier_filter() -> None:
    buf = ArrayChunkBuffer(4, SLOT)
    near = HeldTier(buf, name="near")
    far = seeded_tier(buf, [1], name="far")
    m, engine = make_manager([near, far], buffer=buf, num_chunks=4)
    ctx = ReqContext.create("r", {"kv_store_tiers": ["far"]})
    m.on_new_request(ctx)
    assert engine.lookup_until_known(key(1), ctx) is LookupResult.HIT
    engine.settle()
    assert near.stored_keys() == []


def test_finish_is_forwarded_only_after_a_landed_promotion_cascaded() -> None:
    """Scenario: a request finishes while its promotion is still loading: the
    tiers hear of the finish only after the landed chunk's cascade, which is the
    last job submitted for the request (the tier contract's order)."""
    buf = ArrayChunkBuffer(4, SLOT)
    near = HeldTier(buf, name="near")
    far = seeded_tier(buf, [1], name="far", auto=False)
    m, engine = make_manager([near, far], buffer=buf, num_chunks=4)
    m.on_new_request(R1)
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    engine.step()  # the promotion's load is submitted, and held
    m.on_request_finished(R1)
    assert ("finished", "r1") not in near.calls
    far.release()
    engine.settle()
    assert near.calls[-2:] == [("store", (key(1),)), ("finished", "r1")]
    assert far.calls[-1] == ("finished", "r1")


def test_a_promotion_for_one_group_never_evicts_what_another_group_counted() -> None:
    """Scenario: a hybrid model's two groups. The primary tier is full; group 0's
    chunks 1-2 are readable and the oldest; group 1 has chunk 1 there but chunk
    2 only in the secondary tier. Making room for that promotion takes the
    unrelated chunk, not group 0's chunks, which the same lookup counted."""
    buf = ArrayChunkBuffer(4, SLOT)
    tier = HeldTier(buf)
    g0, g1 = [key(1, 0), key(2, 0)], [key(1, 1), key(2, 1)]
    tier.chunks[g1[1]] = payload(g1[1], SLOT)
    m, engine = make_manager([tier], buffer=buf, num_chunks=4)
    no_cascade = ReqContext.create("w", {"kv_store_tiers": []})
    engine.store([*g0, g1[0]], no_cascade)
    engine.store(keys(9), no_cascade)  # full, and the most recent chunk
    m.on_new_request(R1)
    assert m.lookup_prefixes([g0, g1], R1) == [PrefixLookup(2, 2), PrefixLookup(1, 2)]
    assert [m.lookup(k, R1) for k in (*g0, key(9))] == [
        LookupResult.HIT,
        LookupResult.HIT,
        LookupResult.MISS,
    ]
    engine.step()
    engine.load([*g0, *g1], R1)


def test_promoted_chunk_a_request_parked_reaches_the_tier_ahead_once() -> None:
    """Scenario: r1's lookup promotes chunk 1 from far; while it loads, r2
    (request level for near, the tier ahead of far) offers it, which parks it.
    When the promotion lands, near receives chunk 1 once: r1's cascade to the
    tiers ahead and r2's parked cascade are the same store."""
    buf = ArrayChunkBuffer(4, SLOT)
    near = HeldTier(buf, name="near", policy=OffloadPolicy.REQUEST_LEVEL)
    far = seeded_tier(buf, [1], name="far", auto=False)
    m, engine = make_manager([near, far], buffer=buf, num_chunks=4)
    r2 = ReqContext("r2")
    m.on_new_request(R1)
    m.on_new_request(r2)
    assert m.lookup(key(1), R1) is LookupResult.HIT_PENDING
    engine.step()  # the promotion's load is submitted, and held
    out = m.prepare_store(keys(1), r2)
    assert out is not None and out.keys_to_store == ()
    far.release()
    engine.settle()
    assert near.stored_keys() == keys(1)
    assert far.stored_keys() == []
